"""Write-audit-publish without a JVM: PyIceberg + Arrow for small file loads (issue 21, seed 001).

The same contract as the Spark engine, behind the same service (lakehouse.stage.wap_service), for what
`lakehouse.metadata.engine_support.arrow_blockers` admits (files / staged S3 objects, DuckDB SQL
stages' results, append or whole-table replacement, Arrow-evaluable rules). The package by concern:
`read` (files as Arrow), `conform` (to a schema), `rules` (row rules, tagging, the audit's outcomes),
`tables` (PyIceberg writes and branches), `write` (the write session), `entity_raw`, `to_json`.


* files are probed and reconciled by the same code (`lakehouse.ingest.prepare.prepare_files`,
  with `ArrowSchemaIO` answering the table and footer questions through PyIceberg and pyarrow),
  read with pyarrow into exactly the reconciled schema, with `promote_fields` and the lineage
  columns `_source_file` / `_ingested_at` Spark would add;
* each batch is one PyIceberg append to the `audit_<run_id>` branch, carrying the same snapshot
  properties (file checkpoints, run id); rows failing a quarantine rule go to the quarantine
  table's branch with the same columns;
* the rules are evaluated on the branch's own new files (row count from the snapshot summary):
  row rules and freshness as the shared predicates (lakehouse.validation.predicates) in one
  DuckDB query per batch, with the same outcomes and messages as `lakehouse.validation.rules`;
* publish, kill-switch re-check, conflict handling and exactly-once are the service's, unchanged
  (`lakehouse.table.publish` already works on PyIceberg metadata).

Types are Arrow and Iceberg schemas (lakehouse.engines.types maps them the way Spark's Iceberg
integration does, so a table either engine creates is the same table); this package imports no
pyspark module (tests/test_engine_parity.py checks it). The shared probe and reconciliation still
answer in Spark's types: `read_prepared` and `ArrowSchemaIO` translate at that one edge.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse.engines.arrow import rules
from lakehouse.engines.arrow.conform import conform
from lakehouse.engines.arrow.read import file_batches
from lakehouse.engines.arrow.tables import ArrowTables
from lakehouse.engines.arrow.write import ArrowAuditedWrite
from lakehouse.stage.core import SQL

if TYPE_CHECKING:
    from lakehouse.metadata.model import Rule
    from lakehouse.platform import Platform
    from lakehouse.stage.core import Batch, ExtractPlan, StageContext
    from lakehouse.table.iceberg import CatalogTables
    from lakehouse.validation.rules import CheckOutcome


class ArrowEngine:
    """PyIceberg + Arrow: no JVM (lakehouse.engines.choice chooses it); frames are `pyarrow.Table`s.
    Implements `lakehouse.engines.Engine`."""

    name = "arrow"

    def tables(self, platform: Platform) -> ArrowTables:
        return ArrowTables(platform)

    def session(self, ctx: StageContext, tables: CatalogTables, branch: str, **kwargs: Any) -> ArrowAuditedWrite:
        return ArrowAuditedWrite(ctx, tables, branch, **kwargs)

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        if plan.kind == SQL:  # a DuckDB SQL stage (lakehouse.engines.choice chose Arrow for it)
            from lakehouse.sources.sql import duckdb_arrow_batches

            return duckdb_arrow_batches(ctx, plan)
        return file_batches(ctx, plan, self.tables(ctx.platform))

    def conform(self, frame: pa.Table, schema: pa.Schema) -> pa.Table:
        return conform(frame, schema)

    def tag_failures(self, frame: pa.Table, rules_: list[Rule], errors: dict[str, str], time_zone: str = "UTC"
                     ) -> pa.Table:
        return rules.tag(frame, rules_, errors, time_zone)

    def evaluate(self, frame: pa.Table, rules_: list[Rule], context: dict[str, Any]) -> list[CheckOutcome]:
        return rules.evaluate(frame, rules_, context)
