"""The JVM engine: the source adapters' Spark batches, `SparkAuditedWrite` (lakehouse.engines.spark.write)
on Spark's Iceberg catalog."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from lakehouse.engines.spark.write import SparkAuditedWrite
    from lakehouse.metadata.model import Rule
    from lakehouse.platform import Platform
    from lakehouse.stage.core import Batch, ExtractPlan, StageContext
    from lakehouse.table.iceberg import IcebergTables
    from lakehouse.validation.rules import CheckOutcome


class SparkEngine:
    """The JVM engine: the source adapter's Spark batches, `SparkAuditedWrite` on Spark's catalog;
    frames are Spark DataFrames. Implements `lakehouse.engines.Engine`; the platform's Arrow schemas
    become Spark types here, at the edge (lakehouse.engines.types)."""

    name = "spark"

    def tables(self, platform: Platform) -> IcebergTables:
        return platform.tables()

    def session(self, ctx: StageContext, tables: IcebergTables, branch: str, **kwargs: Any) -> SparkAuditedWrite:
        from lakehouse.engines.spark.write import SparkAuditedWrite

        return SparkAuditedWrite(ctx, tables, branch, **kwargs)

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        return ctx.adapter_for(plan.kind).batches(ctx, plan)

    def conform(self, frame: DataFrame, schema: pa.Schema) -> DataFrame:
        from lakehouse.engines.types import spark_schema
        from lakehouse.ingest.prepare import conform

        return conform(frame, frame.schema, spark_schema(schema))

    def tag_failures(self, frame: DataFrame, rules: list[Rule], errors: dict[str, str], time_zone: str = "UTC"
                     ) -> DataFrame:
        """Expressions answer in the session's time zone (the platform's, lakehouse.runtime.spark)."""
        from lakehouse.validation.rules import tag_failures

        session_zone = frame.sparkSession.conf.get("spark.sql.session.timeZone")
        if session_zone != time_zone:
            raise ValueError(f"the Spark session answers in time zone {session_zone}, not {time_zone}")
        return tag_failures(frame, rules, errors)

    def evaluate(self, frame: DataFrame, rules: list[Rule], context: dict[str, Any]) -> list[CheckOutcome]:
        from lakehouse.validation.rules import evaluate_rules

        return evaluate_rules(frame, rules, context=context)
