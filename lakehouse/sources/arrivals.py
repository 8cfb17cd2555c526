"""What the arrival sensor asks: new input of a stage's source since the cursor, in run batches.

Each kind polls in its own way (S3 by key cursor, a landing directory by modification time:
lakehouse.ingest.s3.poll_s3 / lakehouse.ingest.arrivals.poll_local); this module picks the
source's adapter and applies the kill switches first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakehouse.control.flags import pipeline_stopped, stage_enabled
from lakehouse.ingest.arrivals import ArrivalDecision
from lakehouse.sources.base import registered_adapter

if TYPE_CHECKING:
    from lakehouse.metadata.model import MetadataCatalog, Source
    from lakehouse.platform import Platform


def poll_arrivals(platform: Platform, pipeline_id: str, stage_name: str, cursor: str | None,
                  catalog: MetadataCatalog | None = None) -> ArrivalDecision:
    """`catalog`: the metadata as loaded once for a tick over many sources (default: load it now)."""
    catalog = catalog or platform.catalog()
    ok, reason = stage_enabled(platform.store, catalog, pipeline_id, stage_name)  # + source / target flags
    if not ok:  # a pipeline's kill switch says who threw it, and when
        stopped = pipeline_stopped(platform.store, pipeline_id) if not reason.startswith(("source", "target")) else None
        return ArrivalDecision(skip_reason=stopped or reason, cursor=cursor)
    stage = catalog.stage(pipeline_id, stage_name)
    source = catalog.source(stage.source_id)
    return poll_source(platform, source, cursor, catalog.target(stage.target_id).identifier)


def poll_source(platform: Platform, source: Source, cursor: str | None, identifier: str | None) -> ArrivalDecision:
    """New files of one source since the cursor, through its adapter."""
    return registered_adapter(source.kind).poll(platform, source, cursor, identifier)
