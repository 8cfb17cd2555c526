"""The JVM engine: the source adapters' Spark batches, `SparkAuditedWrite` (lakehouse.engines.spark.write)
on Spark's Iceberg catalog."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse.core import Batch, ExtractPlan, StageContext
    from lakehouse.iceberg import IcebergTables
    from lakehouse.platform import Platform


class SparkEngine:
    """The JVM engine: the source adapter's Spark batches, `SparkAuditedWrite` on Spark's catalog."""

    name = "spark"

    def tables(self, platform: Platform) -> IcebergTables:
        return platform.tables()

    def session(self, ctx: StageContext, tables: IcebergTables, branch: str, **kwargs: Any):
        from lakehouse.engines.spark.write import SparkAuditedWrite

        return SparkAuditedWrite(ctx, tables, branch, **kwargs)

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        return ctx.adapter_for(plan.kind).batches(ctx, plan)
