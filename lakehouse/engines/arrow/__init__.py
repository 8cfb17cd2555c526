"""Write-audit-publish without a JVM: PyIceberg + Arrow for small file loads (issue 21, seed 001).

The same contract as the Spark engine, behind the same service (lakehouse.wap_service), for what
`lakehouse.metadata.engine_support.arrow_blockers` admits (files / staged S3 objects, append, Arrow-evaluable rules):

* files are probed and reconciled by the same code (`lakehouse.ingest.prepare.prepare_files`,
  with `ArrowSchemaIO` answering the table and footer questions through PyIceberg and pyarrow),
  read with pyarrow into exactly the reconciled schema, with `promote_fields` and the lineage
  columns `_source_file` / `_ingested_at` Spark would add;
* each batch is one PyIceberg append to the `audit_<run_id>` branch, carrying the same snapshot
  properties (file checkpoints, run id); rows failing a quarantine rule go to the quarantine
  table's branch with the same columns;
* the rules are evaluated with pyarrow.compute on the branch's own new files (row count from the
  snapshot summary), with the same outcomes and messages as `lakehouse.validation.rules`;
* publish, kill-switch re-check, conflict handling and exactly-once are the service's, unchanged
  (`lakehouse.publish` already works on PyIceberg metadata).

Types travel as Spark's `pyspark.sql.types` (plain Python, no JVM), because the shared probe and
reconciliation speak them; converters here map them to Arrow and Iceberg types the way Spark's
Iceberg integration does, so a table either engine creates is the same table.

PyIceberg's `Transaction.table_metadata` re-applies the staged updates to the table's metadata and
deep-copies the result (pydantic `model_copy(deep=True)`) on every read, and one append reads it
~15 times (snapshot id, branch head, summary, commit): ~8 ms each on a small table, growing with
its snapshots. The engine's appends and branch creations use `_Transaction`, which keeps the
result while neither the table's metadata nor the staged updates change (private-API override,
pyiceberg 0.12; `tests/test_arrow_engine.py`). What is committed is unchanged: the catalog
recomputes the new metadata from the same updates and requirements.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lakehouse.core import SQL
from lakehouse.engines.arrow.read import file_batches
from lakehouse.engines.arrow.tables import ArrowTables
from lakehouse.engines.arrow.write import ArrowAuditedWrite

if TYPE_CHECKING:
    from lakehouse.core import Batch, ExtractPlan, StageContext
    from lakehouse.iceberg import IcebergTables
    from lakehouse.platform import Platform


class ArrowEngine:
    """PyIceberg + Arrow: no JVM (lakehouse.engines.choice chooses it)."""

    name = "arrow"

    def tables(self, platform: Platform) -> ArrowTables:
        return ArrowTables(platform)

    def session(self, ctx: StageContext, tables: IcebergTables, branch: str, **kwargs: Any) -> ArrowAuditedWrite:
        return ArrowAuditedWrite(ctx, tables, branch, **kwargs)

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        if plan.kind == SQL:  # a DuckDB SQL stage (lakehouse.engines.choice chose Arrow for it)
            from lakehouse.sources.sql import duckdb_arrow_batches

            return duckdb_arrow_batches(ctx, plan)
        return file_batches(ctx, plan, self.tables(ctx.platform))


