"""The Arrow engine's tables: writes and branch operations through PyIceberg, no JVM.

PyIceberg's `Transaction.table_metadata` re-applies the staged updates to the table's metadata and
deep-copies the result (pydantic `model_copy(deep=True)`) on every read, and one append reads it
~15 times (snapshot id, branch head, summary, commit): ~8 ms each on a small table, growing with
its snapshots. The engine's appends and branch creations use `lakehouse.compat.pyiceberg.
memo_transaction`, which keeps the result while neither the table's metadata nor the staged updates
change (the one PyIceberg shim that reads its internals; upstream apache/iceberg-python#3302).
What is committed is unchanged: the catalog recomputes the new metadata from the same updates and
requirements.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.table.update.snapshot import ManageSnapshots

from lakehouse.compat.pyiceberg import memo_transaction
from lakehouse.engines.arrow.conform import _conform_array
from lakehouse.engines.types import (
    arrow_to_iceberg,
    arrow_to_spark,
    arrow_type_to_iceberg,
    iceberg_to_spark,
    spark_type_to_iceberg,
)
from lakehouse.table.iceberg import MAIN, CatalogTables, WriteResult, retry_metadata_commit

if TYPE_CHECKING:
    from lakehouse.metadata.model import Target
    from lakehouse.platform import Platform

log = logging.getLogger(__name__)


def _partition_spec(target: Target, schema):
    """The target's partition spec over `schema`, with Spark's partition field names."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import (
        BucketTransform,
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )

    make = {"identity": (IdentityTransform, ""), "bucket": (BucketTransform, "_bucket"),
            "truncate": (TruncateTransform, "_trunc"), "year": (YearTransform, "_year"),
            "month": (MonthTransform, "_month"), "day": (DayTransform, "_day"), "hour": (HourTransform, "_hour")}
    fields = []
    for i, p in enumerate(target.partition_spec):
        cls, suffix = make[p.transform]
        transform = cls(int(p.param)) if p.transform in ("bucket", "truncate") else cls()
        source = schema.find_field(p.column, case_sensitive=False)
        fields.append(PartitionField(source.field_id, 1000 + i, transform, source.name + suffix))
    return PartitionSpec(*fields)


class ArrowTables(CatalogTables):
    """The platform's tables with writes and branch operations through PyIceberg, the metadata
    reads `CatalogTables`' (PyIceberg too): nothing here starts a JVM. The one shared path that
    needs Spark, Iceberg's orphan-file action, takes the platform's Spark tables
    (lakehouse.table.branches.remove_orphan_files)."""

    def __init__(self, platform: Platform):
        super().__init__(platform.settings.catalog_name, platform.pyiceberg_catalog())

    def ensure_namespace(self, ns: str) -> None:
        try:
            self.meta.create_namespace_if_not_exists(ns)
        except Exception:  # the SQL catalog's insert lost to another run's (an IntegrityError, not AlreadyExists)
            if not self.meta.namespace_exists(ns):
                raise

    def ensure_table(self, target: Target, schema: pa.Schema, *, wap: bool = True) -> bool:
        """Create the table as Spark's catalog would from a frame of Arrow schema `schema` (same
        columns, types, field ids, partition spec and properties). True if created."""
        ident = target.identifier
        self.ensure_namespace(target.namespace)
        if self.exists(ident):
            return False
        if target.sort_order:
            raise ValueError(f"{ident}: a sort order is set on write by Spark; the Arrow engine does not sort")
        ice = arrow_to_iceberg(schema)
        props = {"format-version": "2", "write.wap.enabled": "true" if wap else "false", **target.table_properties}
        try:
            self.meta.create_table(ident, schema=ice, partition_spec=_partition_spec(target, ice), properties=props)
        except Exception:
            if self.exists(ident):
                return False  # another run created it at the same moment
            raise
        log.info("created Iceberg table %s (PyIceberg)", ident)
        return True

    def add_missing_columns(self, identifier: str, schema: pa.Schema) -> list[str]:
        table = self.meta.load_table(identifier)
        existing = {f.name.lower() for f in table.schema().fields}
        new = [f for f in schema if f.name.lower() not in existing]
        if new:
            with table.update_schema() as upd:
                for f in new:
                    upd.add_column(f.name, arrow_type_to_iceberg(f.type))
        return [f.name for f in new]

    def create_branch(self, identifier: str, branch: str) -> None:
        """Branch from main's current snapshot; an empty table first gets an empty main snapshot."""
        table = self.meta.load_table(identifier)
        if branch in table.metadata.refs:
            return
        if table.metadata.current_snapshot_id is None:
            with memo_transaction(table) as tx:  # an empty snapshot to branch from
                tx.append(table.schema().as_arrow().empty_table())
        ManageSnapshots(transaction=memo_transaction(table, autocommit=True)).create_branch(
            table.metadata.current_snapshot_id, branch).commit()

    def drop_branch(self, identifier: str, branch: str) -> None:
        if branch == MAIN:
            raise ValueError("refusing to drop the main branch")
        table = self.meta.load_table(identifier)
        if branch in table.metadata.refs:
            table.manage_snapshots().remove_branch(branch).commit()

    def expire_snapshots(self, identifier: str, snapshot_ids: list[int]) -> None:
        """Metadata only: the files of those snapshots wait for the orphan-file sweep."""
        self.meta.load_table(identifier).maintenance.expire_snapshots().by_ids(list(snapshot_ids)).commit()

    def refresh_table(self, identifier: str) -> None:
        """PyIceberg loads the table afresh on every call: nothing is cached to refresh."""

    def write(self, df: pa.Table, target: Target, *, branch: str = MAIN, snapshot_properties: dict[str, str] | None = None,
              mode: str | None = None, spec=None) -> WriteResult:
        """Append `df` to `branch`, or replace the branch's rows with it (`overwrite` of the whole
        table: a DuckDB SQL stage's full recompute), its columns matched to the table's by name."""
        mode = spec.mode if spec is not None else (mode or target.write_mode)
        if mode not in ("append", "overwrite") or (spec is not None and spec.condition is not None):
            raise ValueError(f"{target.identifier}: the Arrow engine appends or replaces the whole table, "
                             f"not {mode!r}" + (" of some rows" if mode == "overwrite" else ""))
        ident = target.identifier
        table = self.meta.load_table(ident)
        before = table.metadata.refs[branch].snapshot_id if branch in table.metadata.refs else None
        rows, props = _to_table(df, table.schema()), dict(snapshot_properties or {})
        with memo_transaction(table) as tx:  # Table.append's transaction, its metadata computed once per state
            if mode == "append":
                tx.append(rows, snapshot_properties=props, branch=branch)
            else:
                import warnings

                with warnings.catch_warnings():  # replacing an empty branch: nothing to delete is no news
                    warnings.filterwarnings("ignore", "Delete operation did not match any records")
                    tx.overwrite(rows, snapshot_properties=props, branch=branch)
        after = self.snapshot_id(ident, branch)
        summary = self.snapshot_summary(ident, after) if after is not None and after != before else {}
        return WriteResult(ident, branch, after, int(summary.get("added-records", 0)), mode, summary)


def _to_table(df: pa.Table, schema) -> pa.Table:
    """`df` in the table's column order and Arrow types (NULL for table columns it lacks)."""
    want = schema.as_arrow()
    by_name = {n.lower(): n for n in df.column_names}
    extra = [n for n in df.column_names if n.lower() not in {f.name.lower() for f in want}]
    if extra:
        raise ValueError(f"column(s) {extra} are not in the table (its columns: {[f.name for f in want]})")
    cols = [pa.nulls(df.num_rows, f.type) if f.name.lower() not in by_name
            else _conform_array(df.column(by_name[f.name.lower()]), f.type) for f in want]
    return pa.table(cols, schema=want)


class ArrowSchemaIO:
    """`prepare_files`' questions answered by PyIceberg and pyarrow (see SparkSchemaIO)."""

    def __init__(self, tables: ArrowTables):
        self.tables = tables

    def exists(self, ident: str) -> bool:
        return self.tables.exists(ident)

    # the shared reconciliation (lakehouse.ingest.prepare) asks and is answered in Spark's types,
    # translated by lakehouse.engines.types: this class is the Arrow engine's one edge to them
    def table_schema(self, ident: str):
        return iceberg_to_spark(self.tables.meta.load_table(ident).schema())

    def footer_schema(self, path: str):
        import pyarrow.parquet as pq

        return arrow_to_spark(pa.struct(list(pq.read_schema(path))))

    def evolve(self, ident: str, changes: list) -> None:
        """New columns (nested too) and promotable widenings in one schema commit."""
        def apply() -> None:
            table = self.tables.meta.load_table(ident)
            current = iceberg_to_spark(table.schema())
            from lakehouse.ingest.prepare import _has_path

            with table.update_schema() as upd:
                for c in changes:
                    if c.kind == "new" and _has_path(current, c.path):
                        continue  # a concurrent run or a healing retry added it already
                    ice = spark_type_to_iceberg(c.found)
                    if c.kind == "new":
                        upd.add_column(tuple(c.path), ice)
                    else:
                        upd.update_column(tuple(c.path), ice)

        retry_metadata_commit(self.tables, ident, apply)

