"""Stages that read Iceberg tables through their SQL (a transformation, or no source at all)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lakehouse.errors import ConfigurationError
from lakehouse.metadata import periods
from lakehouse.sources.base import SourceAdapter, register
from lakehouse.sources.iceberg import probe_table
from lakehouse.sql.parse import rewrite_tables, tables_in_sql
from lakehouse.stage.core import SQL, Batch, ExtractPlan, StageContext, StageOutcome
from lakehouse.stage.pins import pin_upstream, upstream_frames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def upstream_identifiers(ctx: StageContext) -> list[str]:
    """The Iceberg tables the stage reads (from its SQL, its iceberg source or an upstream target)."""
    if ctx.stage.transformation:
        return tables_in_sql(ctx.stage.transformation)
    src = ctx.source
    if src is None:
        return []
    if src.kind == "iceberg":
        return [src.table_identifier]
    up = ctx.catalog.target(src.source_id) if any(t.target_id == src.source_id for t in ctx.catalog.targets) else None
    return [up.identifier] if up else []


def upstream_properties(plan: ExtractPlan) -> dict[str, str]:
    """The snapshot properties of a SQL stage's write: the upstream snapshots it read."""
    return {"lakehouse.upstream": _json(plan.upstream_snapshots)}


def duckdb_arrow_batches(ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
    """A DuckDB SQL stage's one batch as an Arrow table, for the Arrow write engine (no JVM)."""
    from lakehouse.sources.duckdb_sql import stage_arrow

    # Spark's session time zone as the platform configures it: the same day from the same timestamp
    yield Batch(stage_arrow(ctx, plan, ctx.platform.settings.session_time_zone), upstream_properties(plan),
                label="sql")


@register
class SqlAdapter(SourceAdapter):
    kind = SQL

    def plan(self, ctx: StageContext, src: Source | None, plan: ExtractPlan) -> None:
        """Pin every upstream table (`pin_upstream`); a backfill's run notes its partition window."""
        from lakehouse.stage.incremental import partition_window

        pin_upstream(ctx, plan, upstream_identifiers(ctx))
        window = partition_window(ctx)  # a run for some periods of a time-partitioned target (a backfill)
        if window is not None:
            plan.details["partition_window"] = [periods.key(ctx.target.time_partition.granularity, p) for p in window]

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        if ctx.stage.incremental is not None or plan.details.get("partition_window"):
            from lakehouse.stage.incremental import IncrementalRead  # the upstream resolves to less

            read = IncrementalRead(ctx, plan, self.run_sql)
            window = plan.details.get("partition_window")
            g = ctx.target.time_partition.granularity if window else "day"
            yield from read.window_batches(*(periods.parse(g, k) for k in window)) if window else read.batches()
            return
        yield Batch(self.run_sql(ctx, plan), upstream_properties(plan), label="sql")

    def after_publish(self, ctx: StageContext, plan: ExtractPlan, outcome: StageOutcome) -> None:
        """How an incremental stage read its upstream, and a DuckDB stage's engine, go into the run's metadata."""
        outcome.extra.update({k: v for k, v in ctx.report.items()
                              if k.startswith(("incremental", "partition_window", "sql_engine"))})

    def run_sql(self, ctx: StageContext, plan: ExtractPlan, frames: Mapping[str, DataFrame] | None = None) -> DataFrame:
        """The stage's SQL over temp views of the pinned snapshots (identifiers never pasted raw);
        `frames` replaces an upstream's pinned snapshot (an incremental stage's change set)."""
        from pyspark.errors import AnalysisException

        if ctx.stage.sql_engine == "duckdb":
            if frames is None:
                from lakehouse.sources.duckdb_sql import run_stage_sql

                return run_stage_sql(ctx, plan)
            # a backfill's partition window reads change sets as Spark frames: this read stays on Spark
            ctx.report["sql_engine"] = "spark (a partition window's change sets are Spark frames)"
        spark = ctx.platform.spark()
        mapping = {}
        for ident, df in upstream_frames(ctx, plan).items():
            view = "__lh_" + ident.replace(".", "__") + "_" + "".join(c if c.isalnum() else "_" for c in ctx.run_id[:8])
            frame = (frames or {}).get(ident)
            (df if frame is None else frame).createOrReplaceTempView(view)
            mapping[ident.lower()] = view
        sql = ctx.stage.transformation or f"SELECT * FROM {next(iter(mapping.values()))}"
        try:
            return spark.sql(rewrite_tables(sql, mapping))
        except AnalysisException as exc:  # the SQL does not fit the tables: a retry would fail the same way
            raise ConfigurationError(
                f"stage {ctx.stage.pipeline_id}.{ctx.stage.stage_name}: its SQL does not fit the tables it reads "
                f"as they are now: {str(exc).strip().splitlines()[0][:500]}. Fix the SQL (or the upstream "
                "tables), then run again") from exc

    def probe(self, platform: Platform, src: Source | None) -> tuple[bool, str]:
        """A SQL stage reads Iceberg tables: the one named (its iceberg source), if any."""
        if src is not None and src.table_identifier:
            return probe_table(platform, src.table_identifier)
        return True, "reads Iceberg tables; each upstream is probed when the stage is planned"
