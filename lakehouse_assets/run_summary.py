"""A run's events → `lakehouse.stage.run_summary.RunSummary`, for `lakehouse run` and for UI runs.

`lakehouse run` prints the summary and sets it as the run's tags (`lakehouse/outcome`,
`lakehouse/summary`); the sensor `lakehouse_run_summary` does the same for runs launched from the
UI, a schedule or a sensor, once they finish. Both also write it to the audit log
(`event = run_summary`), where `lakehouse audit` shows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime

import dagster as dg

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.orchestration.runs import stage_node
from lakehouse.stage.run_summary import NOT_EVALUATED, CheckReport, RunSummary, StageReport
from resources.lakehouse import LakehouseResource

SENSOR_NAME = "lakehouse_run_summary"
PIPELINE_TAG = "lakehouse/pipeline"


def _value(md: dict, key: str):
    v = md.get(key)
    return getattr(v, "value", v)


def _int(v) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def stage_keys(catalog: MetadataCatalog, pipeline_id: str | None,
               selection: Iterable[dg.AssetKey] | None) -> list[tuple[dg.AssetKey, str]]:
    """(asset key, pipeline.stage) of the stages a run materializes, in pipeline order."""
    targets = {t.target_id: t for t in catalog.targets}
    chosen = {tuple(k.path) for k in selection} if selection else None
    out = []
    for st in sorted(catalog.stages, key=lambda s: (s.pipeline_id, s.stage_order)):
        t = targets.get(st.target_id)
        if t is None:
            continue
        key = dg.AssetKey([st.layer, t.table])
        if (chosen is not None and tuple(key.path) in chosen) or (chosen is None and st.pipeline_id == pipeline_id):
            out.append((key, f"{st.pipeline_id}.{st.stage_name}"))
    return out


def summarize(events: Iterable[dg.DagsterEvent], run_id: str, job: str,
              stages: list[tuple[dg.AssetKey, str]]) -> RunSummary:
    reports = {k.to_user_string(): StageReport(k.to_user_string(), name) for k, name in stages}
    by_base = {k.to_python_identifier(): k.to_user_string() for k, _ in stages}
    run_failed, run_error = False, ""
    planned: dict[str, list[str]] = {}  # asset -> its checks the run's steps were to evaluate
    not_evaluated: dict[str, dict[str, str]] = {}  # asset -> {check: why not}, from its materialization
    for ev in events:
        kind = ev.event_type_value
        if kind in ("ASSET_MATERIALIZATION", "ASSET_OBSERVATION"):  # an observation: a step that changed nothing
            mat = ev.event_specific_data.materialization if kind == "ASSET_MATERIALIZATION" \
                else ev.event_specific_data.asset_observation
            r = reports.get(mat.asset_key.to_user_string())
            if r is None:
                continue
            md = dict(mat.metadata)
            r.materialized = True
            r.rows_written = _int(_value(md, "rows_written"))
            r.rows_read = _int(_value(md, "source_rows_read"))  # the source's own count (JDBC), else the stage's
            if r.rows_read is None:
                r.rows_read = _int(_value(md, "rows_read"))
            r.rows_inserted = _int(_value(md, "rows_inserted"))
            r.rows_updated = _int(_value(md, "rows_updated"))
            r.rows_deleted = _int(_value(md, "rows_deleted"))
            r.rows_rewritten = _int(_value(md, "rows_rewritten"))
            r.files_quarantined = _int(_value(md, "files_quarantined")) or 0
            r.files_deferred = _int(_value(md, "files_deferred")) or 0
            r.quarantined = _int(_value(md, "quarantined_rows")) or 0
            r.skipped_reason = _value(md, "skipped_reason")
            r.snapshot_id = _value(md, "snapshot_id")
            why = _value(md, NOT_EVALUATED)
            if isinstance(why, dict):
                not_evaluated.setdefault(r.asset, {}).update(why)
        elif kind == "ASSET_CHECK_EVALUATION_PLANNED":
            ce = ev.event_specific_data
            if ce.asset_key.to_user_string() in reports:
                planned.setdefault(ce.asset_key.to_user_string(), []).append(ce.check_name)
        elif kind == "ASSET_CHECK_EVALUATION":
            ce = ev.event_specific_data
            r = reports.get(ce.asset_key.to_user_string())
            if r is None:
                continue
            md = dict(ce.metadata)
            details = _value(md, "details") or {}
            if isinstance(details, str):
                details = json.loads(details)
            if isinstance(details, dict):  # drop rules say how many rows they removed
                r.dropped += _int(details.get("dropped")) or 0
            r.checks.append(CheckReport(
                ce.check_name, bool(ce.passed), "error" if ce.severity == dg.AssetCheckSeverity.ERROR else "warn",
                _int(_value(md, "failed_rows")), str(_value(md, "message") or ce.description or ""),
                evaluated="failed_rows" in md))
        elif kind == "STEP_FAILURE":
            base = stage_node(ev.step_key or "")
            r = reports.get(by_base.get(base, ""))
            if r is None:
                continue
            r.failed = True
            data = ev.event_specific_data
            ufd = getattr(data, "user_failure_data", None)
            text = (ufd.description if ufd is not None and ufd.description else
                    _root_cause(data.error) if getattr(data, "error", None) is not None else ev.message or "")
            r.failure = _first_lines(text)
            if ufd is not None:
                md = dict(ufd.metadata or {})
                r.branch = _value(md, "audit_branch") or r.branch
        elif kind == "RUN_FAILURE":
            run_failed = True
            run_error = _first_lines(ev.message or "")
    for asset, names in planned.items():  # a check without a result was not evaluated: say so, and why
        r = reports[asset]
        done = {c.name for c in r.checks}
        if not r.materialized:
            continue  # failed or not run: the stage's own line says why
        for name in dict.fromkeys(names):
            if name not in done:
                why = not_evaluated.get(asset, {}).get(name) or r.skipped_reason or "not evaluated in this run"
                r.checks.append(CheckReport(name, False, "", None, why, evaluated=False))
    return RunSummary(run_id, job, list(reports.values()), run_failed, run_error)


def _root_cause(error) -> str:
    """The error the step raised, without Dagster's DagsterExecutionStepExecutionError wrapper."""
    while (error.cls_name or "").startswith("Dagster") and getattr(error, "cause", None) is not None:
        error = error.cause
    return f"{error.cls_name}: {error.message}" if error.cls_name else error.message


def _first_lines(text: str, n: int = 4) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return " / ".join(lines[:n]) + (f" / … ({len(lines) - n} more lines)" if len(lines) > n else "")


def summarize_run(instance: dg.DagsterInstance, run_id: str, catalog: MetadataCatalog) -> RunSummary:
    run = instance.get_run_by_id(run_id)
    events = [rec.dagster_event for rec in instance.all_logs(run_id) if rec.dagster_event is not None]
    stages = stage_keys(catalog, run.tags.get(PIPELINE_TAG), run.asset_selection)
    # named by its pipeline: a pipeline's run is the asset job (Dagster's `__ASSET_JOB`) with its stages selected
    return summarize(events, run_id, run.tags.get(PIPELINE_TAG) or run.job_name, stages)


def record(instance: dg.DagsterInstance | None, platform, summary: RunSummary, pipeline_id: str | None) -> None:
    """The summary as the run's tags (when the instance keeps the run) and as an audit_log row."""
    if instance is not None and instance.get_run_by_id(summary.run_id) is not None:
        instance.add_run_tags(summary.run_id, summary.tags())
    platform.store.audit(run_id=summary.run_id, pipeline_id=pipeline_id, event="run_summary",
                         outcome=summary.outcome, message=summary.table()[:4000], details=summary.to_dict())


def build_run_summary_sensor() -> dg.SensorDefinition:
    @dg.sensor(name=SENSOR_NAME, minimum_interval_seconds=15, default_status=dg.DefaultSensorStatus.RUNNING,
               description="Tag every finished pipeline run with its per-stage summary (lakehouse/outcome, "
                           "lakehouse/summary) and write it to the audit log, as `lakehouse run` does.")
    def run_summary_sensor(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
        since = datetime.fromisoformat(context.cursor) if context.cursor else None
        records = context.instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE],
                                  updated_after=since), limit=50, order_by="update_timestamp", ascending=True)
        todo = [r.dagster_run for r in records if "lakehouse/outcome" not in r.dagster_run.tags
                and (PIPELINE_TAG in r.dagster_run.tags or r.dagster_run.asset_selection)]
        if records:
            newest = max(r.update_timestamp for r in records)
            context.update_cursor((newest if newest.tzinfo else newest.replace(tzinfo=UTC)).isoformat())
        platform = lakehouse.platform()
        catalog = platform.store.load() if todo else None
        done = []
        for run in todo:  # pipeline jobs, and "Materialize" runs of the asset graph that hold stages
            if not stage_keys(catalog, run.tags.get(PIPELINE_TAG), run.asset_selection):
                continue
            summary = summarize_run(context.instance, run.run_id, catalog)
            record(context.instance, platform, summary, run.tags.get(PIPELINE_TAG))
            done.append(f"{run.run_id[:8]} {summary.outcome}")
        return dg.SkipReason("summarized " + ", ".join(done) if done else "no finished pipeline run to summarize")

    return run_summary_sensor
