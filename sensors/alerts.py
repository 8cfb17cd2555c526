"""Alert sensors: failed and killed runs become alerts; undelivered alerts are retried.

Thin: the alert itself (dedupe, channels, delivery, retries) lives in `lakehouse.ops.alerts`. A run
whose failure a more specific alert already explained (failed audit, kill switch, unreachable
source: those are raised inside the run) gets no second message.
"""

from __future__ import annotations

import dagster as dg

from lakehouse.ops import alerts
from lakehouse.orchestration.runs import failure_summary
from lakehouse.settings import DagsterSettings, current
from lakehouse.stage.runner import Platform
from resources.lakehouse import LakehouseResource

FAILURE_SENSOR = "lakehouse_alerts_run_failure"
CANCELED_SENSOR = "lakehouse_alerts_run_canceled"
DELIVERY_SENSOR = "lakehouse_alerts_delivery"


def _report(context, platform: Platform, run: dg.DagsterRun, status: str, fallback: str) -> dg.SkipReason:
    message, failed = failure_summary(context.instance, run.run_id, fallback, platform.catalog())
    res = alerts.run_finished(platform.store, run_id=run.run_id, status=status, job_name=run.job_name,
                              tags=dict(run.tags), message=message, failed=failed)
    if res is None:
        return dg.SkipReason(f"run {run.run_id[:8]} is covered by an alert raised in the run")
    return dg.SkipReason(f"alert {res.alert_id} for run {run.run_id[:8]}: sent {res.sent}, pending {res.pending}")


# every code location's runs (a platform split into locations, docs/operations.md): these live in the default one
@dg.run_failure_sensor(name=FAILURE_SENSOR, default_status=dg.DefaultSensorStatus.RUNNING, monitor_all_code_locations=True,
                       description="A failed run becomes an alert to the channels of `alert_channels`.")
def run_failure_alerts(context: dg.RunFailureSensorContext, lakehouse: LakehouseResource):
    return _report(context, lakehouse.platform(), context.dagster_run, "FAILURE", context.failure_event.message or "run failed")


@dg.run_status_sensor(run_status=dg.DagsterRunStatus.CANCELED, name=CANCELED_SENSOR,
                      default_status=dg.DefaultSensorStatus.RUNNING, monitor_all_code_locations=True,
                      description="A killed (cancelled / terminated) run becomes an alert.")
def run_canceled_alerts(context: dg.RunStatusSensorContext, lakehouse: LakehouseResource):
    run = context.dagster_run
    return _report(context, lakehouse.platform(), run, "CANCELED", f"run {run.run_id} of {run.job_name} was cancelled")


@dg.sensor(name=DELIVERY_SENSOR, default_status=dg.DefaultSensorStatus.RUNNING,
           minimum_interval_seconds=current(DagsterSettings).alert_retry_interval,
           description="Retry alerts a channel could not take (endpoint down, rate limited) with backoff.")
def alert_delivery(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    out = alerts.deliver_due(lakehouse.platform().store)
    return dg.SkipReason(f"sent {out.sent}, still pending {out.pending}, given up {out.failed}"
                         if out.sent or out.pending or out.failed else "no alert waiting")


def build_alert_sensors() -> list[dg.SensorDefinition]:
    return [run_failure_alerts, run_canceled_alerts, alert_delivery]
