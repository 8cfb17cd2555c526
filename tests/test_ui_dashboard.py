"""The data-quality dashboard asset: the demo pipeline runs twice (a clean batch, then a bad batch
failing a warn rule and an error rule), and the dashboard's table and plot say so."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from lakehouse.cli.demo import generate_user_events
from lakehouse.metadata.loader import load_metadata
from lakehouse.ops.dashboard import compute_overview, render_markdown
from lakehouse_assets.dashboard import DASHBOARD_KEY, dashboard_refresh_sensor, data_quality_dashboard
from lakehouse_assets.definitions import build_definitions, pipeline_job
from resources import LakehouseResource

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def land_bad_batch(landing: Path) -> None:
    """Negative user ids (silver warn rule user_id_positive), an unknown event type (silver error
    rule known_event_type) and a record without id (bronze quarantine)."""
    rows = [
        {"event_id": "bad-1", "user_id": -5, "event_type": "view", "event_ts": "2026-11-03 10:00:00",
         "country": "US", "context": {"device": "web", "app_version": "1.0"}},
        {"event_id": "bad-2", "user_id": -6, "event_type": "teleport", "event_ts": "2026-11-03 11:00:00",
         "country": "DE", "context": {"device": "ios", "app_version": "1.1"}},
        {"event_id": None, "user_id": 7, "event_type": "click", "event_ts": "2026-11-03 12:00:00",
         "country": "FR", "context": {"device": "web", "app_version": "1.2"}},
    ]
    (landing / "user_events_bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_pipeline(platform):
    job = pipeline_job(build_definitions(platform), "user_events_etl")
    return job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


@pytest.fixture
def two_runs(platform):
    platform.store.apply(load_metadata(REPO / "metadata" / "demo"))
    landing = platform.settings.landing_dir / "user_events"
    generate_user_events(landing, rows=600, files=2, seed=3)
    first = run_pipeline(platform)
    assert first.success, "clean batch must pass"
    land_bad_batch(landing)
    second = run_pipeline(platform)
    assert not second.success, "the unknown event type fails a blocking rule"
    return platform, second


def test_dashboard_shows_pass_rates_failures_quarantine_and_branches(two_runs):
    platform, failed_run = two_runs
    ov = compute_overview(platform, last_n=20)

    warn = ov.rule("silver.user_events", "user_id_positive")
    assert warn.last_passed is False and warn.evaluations == 2 and warn.pass_rate == 0.5
    assert warn.failed_rows_trend == [0, 2]
    err = ov.rule("silver.user_events", "known_event_type")
    assert err.last_passed is False and err.pass_rate == 0.5 and err.failed_rows_trend == [0, 1]
    ok = ov.rule("silver.user_events", "event_id_unique")
    assert ok.last_passed is True and ok.pass_rate == 1.0
    gold = ov.rule("gold.daily_user_events", "totals_cover_users")
    assert gold.evaluations == 1  # gold never ran on the bad batch: the silver audit stopped it

    silver = ov.dataset("silver.user_events")
    assert silver.open_audit_branches and all(b.startswith("audit_") for b in silver.open_audit_branches)
    assert ov.dataset("bronze.user_events").quarantine_rows == 2  # one id-less record per batch
    assert ov.dataset("gold.daily_user_events").open_audit_branches == []

    # the dashboard asset publishes exactly this as materialization metadata
    result = dg.materialize([data_quality_dashboard], resources={"lakehouse": LakehouseResource()})
    assert result.success
    mat = result.asset_materializations_for_node(data_quality_dashboard.op.name)[0]
    assert mat.asset_key == DASHBOARD_KEY
    md = mat.metadata
    text = md["overview"].value
    assert text == render_markdown(ov) + text[len(render_markdown(ov)):]  # table first, then the image
    assert "| silver.user_events | user_id_positive | warn | ❌ FAIL | 50% (2) | 0 → 2 |" in text
    assert "| silver.user_events | known_event_type | error | ❌ FAIL | 50% (2) | 0 → 1 |" in text
    assert "| silver.user_events | event_id_unique | error | ✅ pass | 100% (2) |" in text
    assert "| bronze.user_events | 2 | none |" in text
    assert f"| silver.user_events | — | {silver.open_audit_branches[0]} |" in text
    assert "lakehouse branches show" in text  # the next step for an open branch
    assert "](data:image/png;base64," in text
    png = Path(md["plot"].value).read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000
    failing = {(r.dataset, r.rule) for r in ov.failing}
    assert {("silver.user_events", "user_id_positive"), ("silver.user_events", "known_event_type")} <= failing
    assert ("silver.user_events", "event_id_unique") not in failing
    assert md["failing_rules"].value == len(failing) and md["open_audit_branches"].value == 1
    assert md["quarantined_rows"].value == 2


def test_refresh_sensor_requests_dashboard_after_a_finished_run(settings, tmp_path):
    """One dashboard refresh per batch of finished runs (failed ones too), never for its own runs."""

    @dg.op
    def boom():
        raise RuntimeError("a failed pipeline run")

    @dg.job
    def some_pipeline():
        boom()

    (tmp_path / "dh").mkdir()
    instance = dg.DagsterInstance.local_temp(str(tmp_path / "dh"))
    try:
        ctx = dg.build_sensor_context(instance=instance)
        assert isinstance(dashboard_refresh_sensor(ctx), dg.SkipReason)
        run = some_pipeline.execute_in_process(instance=instance, raise_on_error=False)
        assert not run.success
        ctx = dg.build_sensor_context(instance=instance, cursor=ctx.cursor)
        req = dashboard_refresh_sensor(ctx)
        assert isinstance(req, dg.RunRequest) and req.tags["lakehouse/after_run"] == run.run_id
        ctx = dg.build_sensor_context(instance=instance, cursor=ctx.cursor)
        assert isinstance(dashboard_refresh_sensor(ctx), dg.SkipReason)  # nothing new since
        own = dg.materialize([data_quality_dashboard], instance=instance, tags={"lakehouse/dashboard": "refresh"},
                             resources={"lakehouse": LakehouseResource()})
        assert own.success
        ctx = dg.build_sensor_context(instance=instance, cursor=ctx.cursor)
        assert isinstance(dashboard_refresh_sensor(ctx), dg.SkipReason)  # its own runs do not re-trigger it

        # a refresh created but not started yet covers runs finishing meanwhile: no second one requested
        queued = instance.add_run(dg.DagsterRun(job_name="data_quality_dashboard_job",
                                                status=dg.DagsterRunStatus.NOT_STARTED))
        again = some_pipeline.execute_in_process(instance=instance, raise_on_error=False)
        ctx = dg.build_sensor_context(instance=instance, cursor=ctx.cursor)
        skip = dashboard_refresh_sensor(ctx)
        assert isinstance(skip, dg.SkipReason) and queued.run_id in skip.skip_message
        instance.report_run_canceled(queued)  # it never ran: the next finished run requests a refresh again
        third = some_pipeline.execute_in_process(instance=instance, raise_on_error=False)
        ctx = dg.build_sensor_context(instance=instance, cursor=ctx.cursor)
        req = dashboard_refresh_sensor(ctx)
        assert isinstance(req, dg.RunRequest) and req.tags["lakehouse/after_run"] == third.run_id
        assert again.run_id != third.run_id
    finally:
        instance.dispose()
