"""Keeps the Dagster instance in step with throughput metadata, without a redeploy.

Every evaluation syncs pool limits from `throttles` (max_concurrent) and re-tags QUEUED runs for
the profile active now (`profiles` / `pipeline_profiles` / `profile_settings`). Running by default:
it is the platform's own control loop, not an optional feature.
"""

from __future__ import annotations

import dagster as dg

from lakehouse.orchestration.pools import sync_instance
from lakehouse.orchestration.queue import retag_queued_runs
from lakehouse.settings import DagsterSettings, current
from lakehouse.stage.runner import Platform
from resources.lakehouse import LakehouseResource

SENSOR_NAME = "lakehouse_throughput_sync"


def evaluate(instance: dg.DagsterInstance, platform: Platform) -> str:
    pools = sync_instance(instance, platform.store.load())
    retagged = retag_queued_runs(instance, platform.store)
    return f"pools: {pools.summary()}; re-tagged {len(retagged)} queued run(s)"


def build_throughput_sensor() -> dg.SensorDefinition:
    @dg.sensor(
        name=SENSOR_NAME,
        description="Sync pool limits from throttles and re-tag queued runs for the active profile.",
        minimum_interval_seconds=current(DagsterSettings).throughput_sensor_interval,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def throughput_sync(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
        return dg.SkipReason(evaluate(context.instance, lakehouse.platform()))

    return throughput_sync
