"""Quarantine: rows failing a `quarantine` rule, kept next to the dataset with every rule they failed.

The quarantine table `<namespace>.<table>__quarantine` holds the input columns plus
`_failed_rules` (array of rule names), `_run_id`, `_quarantined_at` and `_quarantine_id`.
It is written on the run's audit branch and published with the data, so a failed audit
leaves both tables' `main` untouched and a re-run does not quarantine the same rows twice.
`lakehouse.quarantine_replay.replay` re-validates quarantined rows with the current rules and
moves the passing ones into the dataset through the same write-audit-publish path.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.iceberg import IcebergTables, quote, retry_metadata_commit
from lakehouse.ingest.files import CHECKPOINT_PROPERTY
from lakehouse.metadata.model import Target
from lakehouse.validation.rules import FAILED_RULES_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.core import StageContext
    from lakehouse.platform import Platform

log = logging.getLogger(__name__)

SUFFIX = "__quarantine"
META_COLUMNS = (FAILED_RULES_COLUMN, "_run_id", "_quarantined_at", "_quarantine_id")


def quarantine_identifier(identifier: str) -> str:
    ns, tbl = identifier.split(".", 1)
    return f"{ns}.{tbl}{SUFFIX}"


def quarantine_target(target: Target) -> Target:
    ns, tbl = quarantine_identifier(target.identifier).split(".", 1)
    return Target(target_id=f"{target.target_id}{SUFFIX}", namespace=ns, table=tbl, write_mode="append",
                  description=f"rows of {target.identifier} that failed a quarantine rule")


def align_to_table(df: DataFrame, table_schema) -> DataFrame:
    """Add the table's columns the input lacks as typed NULLs (Iceberg writes resolve by name)."""
    from pyspark.sql import functions as F

    have = {c.lower() for c in df.columns}
    for f in table_schema.fields:
        if f.name.lower() not in have:
            df = df.withColumn(f.name, F.lit(None).cast(f.dataType))
    return df


class QuarantineWriter:
    """Appends a run's quarantined rows to the audit branch of the quarantine table."""

    def __init__(self, runner: StageContext, tables: IcebergTables, branch: str):
        self.runner = runner
        self.tables = tables
        self.branch = branch
        self.target = quarantine_target(runner.target)
        self.ident = self.target.identifier
        self.created = False
        self.fork: int | None = None

    def write(self, bad: DataFrame, batch_properties: dict[str, str] | None = None) -> int:
        from pyspark.sql import functions as F

        rows = (bad.withColumn("_run_id", F.lit(self.runner.run_id))
                .withColumn("_quarantined_at", F.current_timestamp())
                .withColumn("_quarantine_id", F.expr("uuid()")))
        return self.append(rows, rows.schema, batch_properties)

    def align(self, rows: DataFrame) -> DataFrame:
        """The table's columns the rows lack, as typed NULLs (Spark's writer resolves by name)."""
        return align_to_table(rows, self.tables.read(self.ident).schema)

    def append(self, rows, schema, batch_properties: dict[str, str] | None = None) -> int:
        """Rows (with the quarantine columns) onto the quarantine table's branch, which the first
        call starts; the batch's file checkpoints ride along, so they publish exactly once too."""
        if not self.created:
            def start_branch():
                self.tables.ensure_table(self.target, schema)
                if self.branch in self.tables.refs(self.ident):  # a retried step starts over, never doubles rows
                    self.tables.drop_branch(self.ident, self.branch)
                self.tables.create_branch(self.ident, self.branch)

            retry_metadata_commit(self.tables, self.ident, start_branch)
            self.created = True
            self.fork = self.tables.snapshot_id(self.ident)
        retry_metadata_commit(self.tables, self.ident, lambda: self.tables.add_missing_columns(self.ident, schema))
        rows = self.align(rows)
        props = {k: v for k, v in (batch_properties or {}).items() if k == CHECKPOINT_PROPERTY}
        res = self.tables.write(rows, self.target, branch=self.branch,
                                snapshot_properties={**props, "lakehouse.run_id": self.runner.run_id})
        return res.rows_written

    def publish(self) -> None:
        """Publish after the data (same run, under the target's publish lock): never rows of a
        file whose quarantine rows another run already published."""
        if not self.created:
            return
        from lakehouse.publish import publish_branch

        res = publish_branch(self.tables, self.ident, self.branch, since=self.fork, run_id=self.runner.run_id)
        if not res.published:
            raise RuntimeError(f"{self.ident}: quarantine branch {self.branch} not published "
                               f"({res.overlap.message() if res.overlap else 'main moved'}); it is kept for "
                               f"inspection (`lakehouse branches list {self.ident}`)")


# --------------------------------------------------------------------------- inspection and replay
def resolve_dataset(platform: Platform, dataset: str) -> Target:
    """A dataset named by target_id or by identifier (namespace.table)."""
    catalog = platform.catalog()
    for t in catalog.targets:
        if t.target_id == dataset or (t.kind == "iceberg" and t.identifier.lower() == dataset.lower()):
            if t.kind != "iceberg":
                raise KeyError(f"dataset {dataset!r} is a {t.kind} target, not an Iceberg table")
            return t
    known = sorted(t.target_id for t in catalog.targets)
    raise KeyError(f"unknown dataset {dataset!r}; give a target_id or namespace.table, known: {known}")


def read_quarantine(platform: Platform, dataset: str) -> DataFrame | None:
    target = resolve_dataset(platform, dataset)
    tables = platform.tables()
    ident = quarantine_identifier(target.identifier)
    return tables.read(ident) if tables.exists(ident) else None


def summary(platform: Platform, dataset: str) -> list[dict[str, Any]]:
    """Quarantined rows per (rule, run): what `lakehouse quarantine show` prints first."""
    from pyspark.sql import functions as F

    q = read_quarantine(platform, dataset)
    if q is None:
        return []
    rows = (q.select(F.explode(F.col(FAILED_RULES_COLUMN)).alias("rule"), "_run_id", "_quarantined_at")
            .groupBy("rule", "_run_id").agg(F.count(F.lit(1)).alias("rows"), F.max("_quarantined_at").alias("latest"))
            .orderBy("rule", "_run_id").collect())
    return [{"rule": r["rule"], "run_id": r["_run_id"], "rows": r["rows"], "latest": r["latest"]} for r in rows]


@dataclass
class ReplayResult:
    dataset: str
    run_id: str
    candidates: int = 0
    replayed: int = 0
    still_failing: int = 0
    still_failing_by_rule: dict[str, int] = field(default_factory=dict)
    snapshot_id: int | None = None
    published: bool = False


def _delete_ids(platform: Platform, ident: str, ids: list[str]) -> None:
    """Remove replayed rows from quarantine by id (a MERGE keyed on a temp view, no SQL pasting)."""
    spark = platform.spark()
    tables = platform.tables()
    view = f"lh_replayed_{uuid.uuid4().hex[:12]}"
    spark.createDataFrame([(i,) for i in ids], "_quarantine_id string").createOrReplaceTempView(view)
    try:
        spark.sql(f"MERGE INTO {tables.qualified(ident)} t USING {quote(view)} s "
                  "ON t._quarantine_id = s._quarantine_id WHEN MATCHED THEN DELETE")
    finally:
        spark.catalog.dropTempView(view)
