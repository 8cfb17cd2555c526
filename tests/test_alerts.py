"""Alerts (seed 001): each trigger — a failed audit, a failed or killed run, a kill switch thrown, a
source unreachable past its retries — sends exactly one message naming dataset, stage, rule,
failing count and next step, in the run's own failure wording, to the channels configured per
pipeline or criticality: Slack (dagster-slack's client against a local server speaking Slack's Web
API) and a generic webhook. A channel that is down fails no run, and the alert is retried."""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.model import AlertChannel
from lakehouse.ops import alerts
from lakehouse.stage.core import SKIPPED
from lakehouse.stage.runner import Platform, StageRunner
from resources.lakehouse import LakehouseResource
from tests.fixtures.ticks import tick as evaluate_tick

META = """
pipelines:
  - {{pipeline_id: orders_etl, criticality: critical, default_retry_id: once}}
  - {{pipeline_id: misc_etl, criticality: low}}
retry_policies:
  - {{retry_id: once, max_retries: 1, delay_seconds: 0, backoff: constant, jitter: none}}
sources:
  - {{source_id: orders_raw, kind: files, format: jsonl, path: orders}}
  - {{source_id: misc_raw, kind: files, format: jsonl, path: misc}}
targets:
  - {{target_id: bronze_orders, namespace: bronze, table: orders}}
  - {{target_id: bronze_misc, namespace: bronze, table: misc}}
stages:
  - {{pipeline_id: orders_etl, stage_order: 1, stage_name: ingest, layer: bronze, source_id: orders_raw,
     target_id: bronze_orders}}
  - {{pipeline_id: misc_etl, stage_order: 1, stage_name: ingest, layer: bronze, source_id: misc_raw,
     target_id: bronze_misc}}
alert_channels:
  - {{channel_id: oncall_slack, kind: slack, slack_channel: "#critical", criticalities: [critical],
     api_url: "{api_url}"}}
  - {{channel_id: team_hook, kind: webhook, url_env: ALERT_HOOK_URL, token_env: ALERT_HOOK_TOKEN,
     pipelines: [orders_etl, misc_etl]}}
"""

HOOK_SECRET = "hook-s3cr3t-value"
HOOK_TOKEN = "bearer-s3cr3t-token"


@pytest.fixture
def alerting(settings, slack_api, tmp_path, monkeypatch):
    from lakehouse.metadata.store import MetadataStore

    monkeypatch.setenv("ALERT_HOOK_URL", slack_api.hook_url("team") + f"?key={HOOK_SECRET}")
    monkeypatch.setenv("ALERT_HOOK_TOKEN", HOOK_TOKEN)
    monkeypatch.setenv("LAKEHOUSE_DATAHUB", "off")
    f = tmp_path / "meta.yaml"
    f.write_text(META.format(api_url=slack_api.api_url))
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.store.apply(load_metadata(f))
    (settings.landing_dir / "orders").mkdir(parents=True)
    (settings.landing_dir / "misc").mkdir(parents=True)
    return platform


def run_job(platform, job: str, instance):
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    return pipeline_job(build_definitions(platform), job.removesuffix("_job")).execute_in_process(
        instance=instance, raise_on_error=False, tags={"lakehouse/pipeline": job.removesuffix("_job")})


def queued_instance(home):
    """A persistent instance with the queued run coordinator (cancelling a queued run needs one)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("run_coordinator:\n  module: dagster._core.run_coordinator\n"
                                       "  class: QueuedRunCoordinator\ntelemetry:\n  enabled: false\n")
    return dg.DagsterInstance.from_config(str(home))


def job_origin(job_name: str):
    """Where a queued run's job lives (the queue insists on one); plain data, nothing is loaded."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="lakehouse_assets.definitions",
                                                                attribute="defs"), location_name="lakehouse")
    return RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(code_location_origin=location,
                                                                    repository_name="__repository__"),
                           job_name=job_name)


def evaluate_run_sensor(sensor, instance, run_id: str, event_type: dg.DagsterEventType):
    event = instance.all_logs(run_id, of_type=event_type)[-1].dagster_event
    with dg.build_run_status_sensor_context(sensor_name=sensor.name, dagster_event=event, dagster_instance=instance,
                                            dagster_run=instance.get_run_by_id(run_id),
                                            resources={"lakehouse": LakehouseResource()}) as ctx:
        if event_type == dg.DagsterEventType.RUN_FAILURE:
            ctx = ctx.for_run_failure()
        return sensor(ctx)


def slack_fields(msg: dict) -> dict[str, str]:
    """The fields section of our Slack blocks: {name: value}."""
    out = {}
    for block in msg["blocks"]:
        for f in block.get("fields", []):
            name, _, value = f["text"].partition("\n")
            out[name.strip("*")] = value
        text = block.get("text", {}).get("text", "")
        if text.startswith("*next step*"):
            out["next step"] = text.split("\n", 1)[1]
    return out


# --------------------------------------------------------------------------- model (fast)


def test_channel_model_and_references(tmp_path):
    with pytest.raises(ValueError, match="needs slack_channel"):
        AlertChannel(channel_id="s", kind="slack")
    with pytest.raises(ValueError, match="needs url or url_env"):
        AlertChannel(channel_id="w", kind="webhook")
    with pytest.raises(ValueError, match="must not carry credentials"):
        AlertChannel(channel_id="w", kind="webhook", url="https://user:pw@hooks.example/x")
    ch = AlertChannel(channel_id="w", kind="webhook", url="https://hooks.example/x", pipelines=["a"],
                      criticalities=["critical"], events=["audit_failed"])
    assert ch.wants("audit_failed", "a", "low") and ch.wants("audit_failed", "b", "critical")
    assert not ch.wants("audit_failed", "b", "low") and not ch.wants("run_failed", "a", "low")
    f = tmp_path / "m.yaml"
    f.write_text("alert_channels:\n  - {channel_id: w, kind: webhook, url: 'https://h/x', pipelines: [nope]}\n")
    with pytest.raises(MetadataError, match=r"alert_channels\[0\]\.pipelines\[0\]: unknown pipeline 'nope'"):
        load_metadata(f)


# --------------------------------------------------------------------------- triggers (servers, no Spark)


@pytest.mark.slow
def test_source_unreachable_past_retries_sends_one_message(alerting, slack_api, monkeypatch):
    from sensors.alerts import run_failure_alerts

    monkeypatch.setenv("LAKEHOUSE_FAULTS", "source_down:source=orders_raw")
    instance = dg.DagsterInstance.ephemeral()
    result = run_job(alerting, "orders_etl_job", instance)
    assert not result.success
    assert len(slack_api.messages) == 1 and len(slack_api.hooks) == 1, (slack_api.messages, slack_api.rejected)
    msg = slack_api.messages[0]
    assert msg["channel"] == "#critical"
    fields = slack_fields(msg)
    assert fields["dataset"] == "bronze.orders" and fields["stage"] == "orders_etl.ingest"
    assert fields["rule"] == "source orders_raw"
    assert fields["failing count"] == "1"  # the retry policy's one retry was spent
    assert "lakehouse lineage paths bronze_orders" in fields["next step"]
    # the alert quotes the run's failure message
    from lakehouse.orchestration.runs import step_failures

    (step, failure), = step_failures(instance, result.run_id)
    assert step.endswith("__extract") and "orders_raw" in failure
    assert failure in msg["text"]
    hook = slack_api.hooks[0]
    assert hook["headers"]["Authorization"] == f"Bearer {HOOK_TOKEN}"
    assert hook["body"]["kind"] == "source_unavailable" and hook["body"]["message"] == failure
    assert hook["body"]["dataset"] == "bronze.orders" and hook["body"]["failing_count"] == 1
    # the run-failure sensor sees the failed run, but the source alert already explained it
    skip = evaluate_run_sensor(run_failure_alerts, instance, result.run_id, dg.DagsterEventType.RUN_FAILURE)
    assert "covered" in str(skip.skip_message)
    assert len(slack_api.messages) == 1 and len(slack_api.hooks) == 1


@pytest.mark.slow
def test_failed_and_killed_runs_alert_once_each_with_routing(alerting, slack_api, monkeypatch):
    from sensors.alerts import run_canceled_alerts, run_failure_alerts

    monkeypatch.setenv("LAKEHOUSE_FAULTS", "fail:point=extract,message=disk quota exceeded on /scratch")
    instance = dg.DagsterInstance.ephemeral()
    result = run_job(alerting, "orders_etl_job", instance)
    assert not result.success
    assert slack_api.messages == [] and slack_api.hooks == []  # nothing raised inside the run for this one
    for _ in range(2):  # the sensor may see the run twice (a re-evaluated tick): still one message
        evaluate_run_sensor(run_failure_alerts, instance, result.run_id, dg.DagsterEventType.RUN_FAILURE)
    assert len(slack_api.messages) == 1 and len(slack_api.hooks) == 1
    body = slack_api.hooks[0]["body"]
    assert body["kind"] == "run_failed" and body["run_id"] == result.run_id
    assert body["stage"] == "orders_etl.ingest" and body["dataset"] == "bronze.orders"
    assert "disk quota exceeded on /scratch" in body["message"] and f"open run {result.run_id}" in body["next_step"]
    assert "disk quota exceeded on /scratch" in slack_api.messages[0]["text"]

    # a killed run of the low-criticality pipeline: the webhook (per pipeline) gets it, Slack (critical only) not
    monkeypatch.delenv("LAKEHOUSE_FAULTS")
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    job = pipeline_job(build_definitions(alerting), "misc_etl")
    run = instance.create_run_for_job(job, tags={"lakehouse/pipeline": "misc_etl"})
    instance.report_run_canceled(run)
    evaluate_run_sensor(run_canceled_alerts, instance, run.run_id, dg.DagsterEventType.RUN_CANCELED)
    evaluate_run_sensor(run_canceled_alerts, instance, run.run_id, dg.DagsterEventType.RUN_CANCELED)
    assert len(slack_api.messages) == 1 and len(slack_api.hooks) == 2
    killed = slack_api.hooks[1]["body"]
    assert killed["kind"] == "run_canceled" and killed["pipeline_id"] == "misc_etl" and killed["run_id"] == run.run_id


@pytest.mark.slow
def test_kill_switch_one_message_per_flip(alerting, slack_api):
    from lakehouse.cli import main as cli
    from lakehouse.orchestration.killswitch import enforce

    assert cli(["pipeline", "disable", "orders_etl"]) == 0
    # a kill switch skips the step (not a failure, issue 39) and raises the alert with the step's reason
    first = StageRunner(alerting, "orders_etl", "ingest", run_id="run0001").extract()
    assert first.kind == SKIPPED and "`lakehouse pipeline enable orders_etl`" in first.skipped_reason
    assert len(slack_api.messages) == 1
    fields = slack_fields(slack_api.messages[0])
    assert first.skipped_reason in slack_api.messages[0]["text"]  # the step's own reason
    assert fields["dataset"] == "bronze.orders" and fields["stage"] == "orders_etl.ingest"
    assert fields["rule"] == "pipeline/orders_etl"
    assert "lakehouse pipeline enable orders_etl" in fields["next step"]

    # the same flip stops another run's step and a queued run: no second message
    assert StageRunner(alerting, "orders_etl", "ingest", run_id="run0002").extract().kind == SKIPPED
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    instance = queued_instance(alerting.settings.home / "dagster")
    job = pipeline_job(build_definitions(alerting), "orders_etl")
    queued = instance.create_run_for_job(job, tags={"lakehouse/pipeline": "orders_etl"},
                                         status=dg.DagsterRunStatus.QUEUED, remote_job_origin=job_origin(job.name))
    assert [d.run_id for d in enforce(instance, alerting)] == [queued.run_id]
    assert instance.get_run_by_id(queued.run_id).status == dg.DagsterRunStatus.CANCELED
    assert len(slack_api.messages) == 1 and len(slack_api.hooks) == 1
    assert alerts.covered(alerting.store, queued.run_id)  # so its CANCELED status raises nothing more

    # the next flip is a new trigger
    assert cli(["pipeline", "enable", "orders_etl"]) == 0
    assert cli(["pipeline", "disable", "orders_etl"]) == 0
    assert StageRunner(alerting, "orders_etl", "ingest", run_id="run0003").extract().kind == SKIPPED
    assert len(slack_api.messages) == 2 and len(slack_api.hooks) == 2


@pytest.mark.slow
def test_channel_down_fails_no_run_and_the_alert_is_retried(alerting, slack_api, monkeypatch, capsys):
    from lakehouse.cli import main as cli
    from sensors.alerts import alert_delivery

    monkeypatch.setenv("LAKEHOUSE_ALERT_BACKOFF_SECONDS", "0")  # retry at the next tick (default: 30 s doubling)
    slack_api.stop()  # Slack and the webhook are both unreachable now
    assert cli(["target", "disable", "bronze_orders"]) == 0
    instance = dg.DagsterInstance.ephemeral()
    result = run_job(alerting, "orders_etl_job", instance)
    assert result.success  # the stage was skipped (target off), and the dead channels changed nothing
    assert not result.get_asset_materialization_events()  # it changed nothing: an observation says why
    md = result.get_asset_observation_events()[0].asset_observation_data.asset_observation.metadata
    assert "target 'bronze_orders' is disabled" in md["skipped_reason"].value
    (alert,) = alerts.recent(alerting.store)
    assert alert["kind"] == "kill_switch" and alert["dataset"] == "bronze.orders"
    assert {d["channel_id"]: d["status"] for d in alert["deliveries"]} == {"oncall_slack": "pending",
                                                                            "team_hook": "pending"}
    assert all(d["attempts"] == 1 and d["last_error"] for d in alert["deliveries"])

    # the retry sensor tries again while the channels are still down: kept, not lost, not doubled
    assert "still pending 2" in str(evaluate_tick(alert_delivery, instance=instance).skip_message)
    slack_api.start()
    assert "sent 2" in str(evaluate_tick(alert_delivery, instance=instance).skip_message)
    assert "no alert waiting" in str(evaluate_tick(alert_delivery, instance=instance).skip_message)
    assert len(slack_api.messages) == 1 and len(slack_api.hooks) == 1
    assert "target 'bronze_orders' is disabled" in slack_api.hooks[0]["body"]["message"]
    deliveries = alerts.recent(alerting.store)[0]["deliveries"]
    assert [(d["status"], d["attempts"]) for d in deliveries] == [("sent", 3), ("sent", 3)]

    # secrets (Slack token, webhook URL secret and bearer token) are nowhere in the outbox
    with alerting.store.engine.connect() as conn:
        dump = " ".join(str(r) for t in (alerts.alerts_table, alerts.alert_deliveries)
                        for r in conn.execute(sa.select(t)).all())
    assert HOOK_SECRET not in dump and HOOK_TOKEN not in dump and slack_api.token not in dump
    assert cli(["alerts", "list"]) == 0
    assert "oncall_slack: sent" in capsys.readouterr().out


# --------------------------------------------------------------------------- a failed audit (Spark)

DEMO_ALERTS = """
alert_channels:
  - {{channel_id: analytics_slack, kind: slack, slack_channel: "#data-alerts", pipelines: [user_events_etl],
     api_url: "{api_url}"}}
"""


@pytest.mark.slow
def test_failed_audit_sends_one_message_and_the_dashboard_shows_it(settings, spark, slack_api, tmp_path,
                                                                    monkeypatch):
    import json
    import shutil
    from pathlib import Path

    from lakehouse.cli.demo import generate_user_events
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.ops.dashboard import compute_overview, render_markdown
    from sensors.alerts import run_failure_alerts

    monkeypatch.setenv("LAKEHOUSE_DATAHUB", "off")
    meta = tmp_path / "meta"
    shutil.copytree(Path(__file__).resolve().parent.parent / "metadata" / "demo", meta)
    (meta / "alerts.yaml").write_text(DEMO_ALERTS.format(api_url=slack_api.api_url))
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.spark()
    platform.store.apply(load_metadata(meta))
    landing = settings.landing_dir / "user_events"
    generate_user_events(landing, rows=400, files=1, seed=3)
    bad = [{"event_id": f"bad-{i}", "user_id": 7, "event_type": "teleport", "event_ts": "2026-11-03 10:00:00",
            "country": "DE", "context": {"device": "web", "app_version": "1"}} for i in range(3)]
    (landing / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))

    instance = dg.DagsterInstance.ephemeral()
    result = run_job(platform, "user_events_etl_job", instance)
    assert not result.success
    assert len(slack_api.messages) == 1, slack_api.rejected
    msg = slack_api.messages[0]
    fields = slack_fields(msg)
    assert msg["channel"] == "#data-alerts"
    assert fields["dataset"] == "silver.user_events" and fields["stage"] == "user_events_etl.silver_clean"
    assert fields["rule"] == "known_event_type"
    assert fields["failing count"] == "3"  # the three teleport rows, counted independently above
    assert fields["next step"].startswith("lakehouse branches show silver.user_events audit_")
    from lakehouse.orchestration.runs import step_failures

    (step, failure), = step_failures(instance, result.run_id)
    # a SQL stage is one op (no source pool): its step key is the asset's
    assert step == "silver__user_events" and "failed blocking rule(s) known_event_type" in failure
    assert failure in msg["text"]  # the run's failure message, word for word
    evaluate_run_sensor(run_failure_alerts, instance, result.run_id, dg.DagsterEventType.RUN_FAILURE)
    assert len(slack_api.messages) == 1  # the run's failure is the audit's: no second message

    # the data-quality dashboard: the alert beside the check history that caused it
    ov = compute_overview(platform)
    (row,) = ov.alerts
    assert (row.kind, row.dataset, row.rule, row.failing_count, row.delivered) == (
        "audit_failed", "silver.user_events", "known_event_type", 3, True)
    assert not ov.rule("silver.user_events", "known_event_type").last_passed
    text = render_markdown(ov)
    assert text.index("### Checks") < text.index("### Alerts")
    assert "| audit_failed | silver.user_events | user_events_etl.silver_clean | known_event_type | 3 | " \
           "analytics_slack: sent |" in text
