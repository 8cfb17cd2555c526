"""The kill switch's enforcer: every few seconds, stop runs of pipelines the control flags disable.

Thin: the decisions live in `lakehouse.orchestration.killswitch`. Running by default (it is a safety
control, not an optional feature); the interval is LAKEHOUSE_KILL_SWITCH_INTERVAL seconds
(default 5), which with the daemon's tick keeps a flip-to-terminate well under 30 seconds.
"""

from __future__ import annotations

import dagster as dg

from lakehouse.orchestration.killswitch import enforce
from lakehouse.settings import DagsterSettings, current
from resources.lakehouse import LakehouseResource

SENSOR_NAME = "lakehouse_kill_switch"


def build_killswitch_sensor() -> dg.SensorDefinition:
    @dg.sensor(
        name=SENSOR_NAME,
        description="Cancel queued and terminate in-flight runs of pipelines/stages disabled in control_flags.",
        minimum_interval_seconds=current(DagsterSettings).kill_switch_interval,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def kill_switch(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
        stopped = enforce(context.instance, lakehouse.platform())
        if not stopped:
            return dg.SkipReason("no active run of a disabled pipeline")
        return dg.SkipReason("; ".join(f"{d.action} {d.run_id[:8]} ({d.pipeline_id}): {d.reason}" for d in stopped))

    return kill_switch
