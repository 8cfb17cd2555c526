"""File-arrival sensors: one per (pipeline, ingesting stage) whose source is a landing zone or S3 prefix.

The listing, cursor and batching logic lives in `lakehouse.ingest.arrivals`; this module only
turns its decisions into RunRequests / SkipReasons.
"""

from __future__ import annotations

import dagster as dg

from lakehouse.ingest.arrivals import poll_arrivals
from lakehouse.ingest.s3 import ARRIVAL_TAG
from lakehouse.metadata.model import MetadataCatalog
from lakehouse.runner import Platform
from lakehouse.throughput.queue import instance_of, request_tags
from lakehouse_assets.factory import stage_asset_key


def build_arrival_sensors(catalog: MetadataCatalog) -> list[dg.SensorDefinition]:
    sensors = []
    for stage in catalog.stages:
        src = next((s for s in catalog.sources if s.source_id == stage.source_id), None)
        if src is None or src.kind not in ("files", "s3") or stage.transformation:
            continue
        sensors.append(_arrival_sensor(catalog, stage.pipeline_id, stage.stage_name, src.source_id,
                                       stage_asset_key(catalog, stage)))
    return sensors


def _arrival_sensor(catalog: MetadataCatalog, pipeline_id: str, stage_name: str, source_id: str,
                    key: dg.AssetKey) -> dg.SensorDefinition:
    # Materialize the ingesting asset and everything downstream of it in the same pipeline.
    selection = dg.AssetSelection.assets(key).downstream()

    @dg.sensor(
        name=f"{pipeline_id}__{stage_name}__arrivals",
        description=f"New files in source {source_id!r} start pipeline {pipeline_id!r} from stage {stage_name!r}.",
        asset_selection=selection,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def arrivals(context: dg.SensorEvaluationContext):
        platform = Platform.from_env()
        decision = poll_arrivals(platform, pipeline_id, stage_name, context.cursor)
        if decision.skip_reason:
            if decision.cursor is not None:
                context.update_cursor(decision.cursor)
            return dg.SkipReason(decision.skip_reason)
        requests = [
            dg.RunRequest(run_key=b.run_key, tags={**request_tags(platform.store, pipeline_id, instance_of(context)),
                                                   "lakehouse/pipeline": pipeline_id, "lakehouse/files": str(len(b.files)),
                                                   ARRIVAL_TAG: b.run_key, **decision.tags})
            for b in decision.batches
        ]
        context.update_cursor(decision.cursor)
        return dg.SensorResult(run_requests=requests)

    return arrivals
