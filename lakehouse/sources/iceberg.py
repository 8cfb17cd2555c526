"""An existing Iceberg table read as a source (also: a target read as a recovery upstream)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from lakehouse.sources.base import SourceAdapter, register
from lakehouse.stage.core import Batch, ExtractPlan, StageContext
from lakehouse.stage.pins import pin_upstream, upstream_frames

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform


def probe_table(platform: Platform, identifier: str) -> tuple[bool, str]:
    """An Iceberg table is available as an upstream when it loads from storage (not from the
    process's parsed copy of its metadata) and has a current snapshot."""
    cat = platform.pyiceberg_catalog()
    try:
        table = getattr(cat, "load_table_from_storage", cat.load_table)(identifier)
    except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
        return False, f"table {identifier} does not load: {type(exc).__name__}: {exc}"
    if table.current_snapshot() is None:
        return False, f"table {identifier} has no snapshot yet"
    return True, f"table {identifier} loads"


@register
class IcebergAdapter(SourceAdapter):
    kind = "iceberg"

    def plan(self, ctx: StageContext, src: Source, plan: ExtractPlan) -> None:
        pin_upstream(ctx, plan, [src.table_identifier])

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        yield Batch(upstream_frames(ctx, plan)[ctx.source.table_identifier], label="table")

    def probe(self, platform: Platform, src: Source) -> tuple[bool, str]:
        return probe_table(platform, src.table_identifier)

    def dataset_name(self, src: Source) -> tuple[str, str]:
        return "iceberg", (src.table_identifier or src.source_id).lower()
