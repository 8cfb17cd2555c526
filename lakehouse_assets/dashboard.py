"""The data-quality dashboard as an asset, refreshed by a sensor after every pipeline run.

The computation lives in `lakehouse.ops.dashboard`; the asset only publishes it as materialization
metadata (a Markdown table with the plot embedded as a data-URI PNG, and the PNG's path).
"""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg

from lakehouse.ops import dashboard

DASHBOARD_KEY = dg.AssetKey(["ops", "data_quality_dashboard"])
DASHBOARD_JOB = "data_quality_dashboard_job"
DASHBOARD_TAG = "lakehouse/dashboard"


@dg.asset(
    key=DASHBOARD_KEY,
    group_name="ops",
    kinds={"python"},
    required_resource_keys={"lakehouse"},
    description="Data-quality overview across all datasets: last result and pass rate per rule, failing-row "
                "trend, quarantine size, open audit branches. Refreshed after every pipeline run.",
)
def data_quality_dashboard(context) -> dg.MaterializeResult:
    platform = context.resources.lakehouse.platform()
    last_n = platform.settings.dashboard_last_n
    ov = dashboard.compute_overview(platform, last_n=last_n)
    png = dashboard.render_png(ov)
    out = platform.settings.home / "dashboard"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "data_quality.png"
    path.write_bytes(png)
    md = dashboard.render_markdown(ov) + f"\n\n![data quality overview]({dashboard.png_data_uri(png)})\n"
    stats = dashboard.summary(ov)
    context.log.info(f"data-quality dashboard: {stats['rules']} rules, {stats['failing_rules']} failing, "
                     f"{stats['quarantined_rows']} quarantined rows, {stats['open_audit_branches']} open audit branches")
    return dg.MaterializeResult(metadata={
        "overview": dg.MetadataValue.md(md),
        "plot": dg.MetadataValue.path(str(path)),
        **stats,
    })


dashboard_job = dg.define_asset_job(DASHBOARD_JOB, selection=[DASHBOARD_KEY], tags={DASHBOARD_TAG: "refresh"},
                                    description="Recompute the data-quality dashboard.")

_FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
_WAITING = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING]


@dg.sensor(
    name="data_quality_dashboard_refresh",
    job=dashboard_job,
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="After any run that finished (success or failure, since failed checks matter most), "
                "refresh the data-quality dashboard once.",
)
def dashboard_refresh_sensor(context: dg.SensorEvaluationContext):
    since = datetime.fromisoformat(context.cursor) if context.cursor else None
    records = context.instance.get_run_records(
        filters=dg.RunsFilter(statuses=_FINISHED, updated_after=since), limit=100, order_by="update_timestamp",
        ascending=False,
    )
    runs = [r for r in records if r.dagster_run.tags.get(DASHBOARD_TAG) is None
            and r.dagster_run.job_name != DASHBOARD_JOB]
    if records:
        newest = max(r.update_timestamp for r in records)
        newest = newest if newest.tzinfo else newest.replace(tzinfo=UTC)
        context.update_cursor(newest.isoformat())
    if not runs:
        return dg.SkipReason("no pipeline run finished since the last refresh")
    # a refresh that has not started yet will read these runs' results too: a burst of runs (say 20
    # API loads) queues one refresh, not one per sensor tick
    waiting = context.instance.get_run_records(filters=dg.RunsFilter(job_name=DASHBOARD_JOB, statuses=_WAITING),
                                               limit=1)
    if waiting:
        return dg.SkipReason(f"{len(runs)} run(s) finished; refresh {waiting[0].dagster_run.run_id} is still "
                             "waiting to start and will include them")
    latest = runs[0].dagster_run
    return dg.RunRequest(run_key=f"after_{latest.run_id}", tags={DASHBOARD_TAG: "refresh",
                                                                 "lakehouse/after_run": latest.run_id})


def dashboard_definitions() -> dict:
    """The pieces definitions.py adds: assets, jobs, sensors."""
    return {"assets": [data_quality_dashboard], "jobs": [dashboard_job], "sensors": [dashboard_refresh_sensor]}
