"""Iceberg table handling from Spark: creation from metadata, write modes, branches, publish.

Every identifier that reaches SQL text is backtick-quoted by `quote`, every value is passed
as a literal through `sql_string`; nothing from metadata or data is pasted in raw.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.metadata.model import PartitionField, SortField, Target
from lakehouse.sql.text import quote, sql_string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

MAIN = "main"


def ddl_type(dtype) -> str:
    """A Spark type as DDL text with every nested field name quoted (`simpleString` quotes none,
    so a struct field named `a b` or `größe.x` would not parse)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(dtype, StructType):
        return "struct<" + ",".join(f"{quote(f.name)}:{ddl_type(f.dataType)}" for f in dtype.fields) + ">"
    if isinstance(dtype, ArrayType):
        return f"array<{ddl_type(dtype.elementType)}>"
    if isinstance(dtype, MapType):
        return f"map<{ddl_type(dtype.keyType)},{ddl_type(dtype.valueType)}>"
    return dtype.simpleString()


def partition_expr(p: PartitionField) -> str:
    col = quote(p.column)
    if p.transform == "identity":
        return col
    if p.transform in ("bucket", "truncate"):
        return f"{p.transform}({int(p.param)}, {col})"
    return f"{p.transform}s({col})"  # years / months / days / hours


def sort_expr(s: SortField) -> str:
    out = f"{quote(s.column)} {s.direction.upper()}"
    if s.nulls:
        out += f" NULLS {s.nulls.upper()}"
    return out


def _rides_out(method):
    """A catalog call that waits out a short outage of the catalog database (lakehouse.runtime.outage);
    only for calls that are safe to repeat (reads and IF [NOT] EXISTS DDL)."""
    import functools

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        from lakehouse.runtime.outage import ride_out

        return ride_out(lambda: method(self, *args, **kwargs), database=self.catalog_label,
                        what=f"{method.__name__.strip('_').replace('_', ' ')} {args[0] if args else ''}".strip(),
                        role="Iceberg catalog")

    return call


def branch_name_for_run(run_id: str) -> str:
    return "audit_" + "".join(ch if ch.isalnum() else "_" for ch in run_id)[:48]


@dataclass
class WriteResult:
    """One commit of a write. `rows_written` is physical: the snapshot summary's added-records, every
    row of every data file the commit wrote (a copy-on-write MERGE rewrites whole files, so it counts
    the unchanged rows of those files too). The logical counts say what the stage's logic did:
    `rows_in` rows of the batch written (a merge: its change set), of which `rows_inserted` are new
    rows and `rows_updated` replaced a row with the same key; `rows_deleted` rows the logic removed (a
    replace-where overwrite: the rows it replaced). None: not counted (then they follow from the
    physical counts, `logical`)."""

    table: str
    branch: str
    snapshot_id: int | None
    rows_written: int
    operation: str
    summary: dict[str, str] = field(default_factory=dict)
    rows_in: int | None = None
    rows_inserted: int | None = None
    rows_updated: int | None = None
    rows_deleted: int | None = None

    @property
    def physical_rows_deleted(self) -> int:
        """Rows of the data files the commit removed (the snapshot summary's deleted-records)."""
        return int(self.summary.get("deleted-records", 0) or 0)

    def logical(self) -> dict[str, int]:
        """{rows_in, rows_inserted, rows_updated, rows_deleted}: as counted, else what an append or an
        overwrite's summary says (their added rows are the batch's rows, their deleted rows the ones
        the logic replaced)."""
        added = self.rows_written
        deleted = self.physical_rows_deleted if self.operation != "append" else 0
        return {"rows_in": added if self.rows_in is None else self.rows_in,
                "rows_inserted": added if self.rows_inserted is None else self.rows_inserted,
                "rows_updated": 0 if self.rows_updated is None else self.rows_updated,
                "rows_deleted": deleted if self.rows_deleted is None else self.rows_deleted}


@dataclass(frozen=True)
class WriteSpec:
    """A batch's own write, instead of the target's write_mode (an incremental stage's merge, or
    its replacement of the partitions its input touched: lakehouse.stage.incremental)."""

    mode: str  # merge | overwrite (of the rows `condition` selects; all rows when None)
    merge_keys: tuple[str, ...] = ()
    order_by: str | None = None  # merge: a matched row is replaced only by a row at least as new
    condition: Any = None  # overwrite: a pyspark Column selecting the rows replaced
    # merge: Spark SQL over the target (alias `t`) true for every row a source key can match, so the
    # MERGE reads only the files it may change (lakehouse.stage.pruning.KeyScope.sql)
    prune: str | None = None


class CatalogTables:
    """One catalog's tables as PyIceberg reads their metadata (existence, refs, snapshot summaries,
    data files): what every engine's tables handle shares, engine-neutral. An engine adds the
    writes and the branch and schema operations (`ensure_namespace`, `ensure_table`,
    `add_missing_columns`, `create_branch`, `drop_branch`, `expire_snapshots`, `refresh_table`,
    `write`): `IcebergTables` through Spark, `lakehouse.engines.arrow.tables.ArrowTables` through
    PyIceberg."""

    def __init__(self, catalog: str, meta_catalog: Any | None = None):
        self.catalog = catalog
        self.meta = meta_catalog

    def _meta_table(self, identifier: str):
        return self.meta.load_table(identifier)

    @_rides_out
    def exists(self, identifier: str) -> bool:
        return self.meta.table_exists(identifier)

    @_rides_out
    def refs(self, identifier: str) -> dict[str, int]:
        return _ref_ids(self._meta_table(identifier).metadata)

    @_rides_out
    def refs_if_exists(self, identifier: str) -> dict[str, int] | None:
        """`refs`, or None when the table does not exist: one metadata load for both questions."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self._meta_table(identifier)
        except NoSuchTableError:
            return None
        return _ref_ids(table.metadata)

    def snapshot_id(self, identifier: str, branch: str = MAIN) -> int | None:
        return self.refs(identifier).get(branch)

    @_rides_out
    def snapshot_summary(self, identifier: str, snapshot_id: int) -> dict[str, str]:
        return _summary_of(self._meta_table(identifier).metadata, snapshot_id)

    @_rides_out
    def _new_head(self, identifier: str, branch: str, before: int | None) -> tuple[int | None, dict[str, str]]:
        """The branch's snapshot after a write and, when the write moved it, that snapshot's summary
        (one metadata load for both)."""
        metadata = self._meta_table(identifier).metadata
        ref = metadata.refs.get(branch)
        after = ref.snapshot_id if ref is not None else None
        return after, (_summary_of(metadata, after) if after is not None and after != before else {})

    @_rides_out
    def ancestors(self, identifier: str, snapshot_id: int | None) -> list[int]:
        """Snapshot ids from `snapshot_id` back to the first, via parent links."""
        if snapshot_id is None:
            return []
        snaps = self._meta_table(identifier).metadata.snapshots
        return _walk_parents({sn.snapshot_id: sn.parent_snapshot_id for sn in snaps}, snapshot_id)

    @_rides_out
    def data_files(self, identifier: str, head: int, since: int | None = None):
        """(PyIceberg schema, live data files) of snapshot `head`: those added after snapshot
        `since` when given (an append-only branch: `since` is where it forked), else all of them.

        Read from the manifests with PyIceberg, no Spark job. None without a PyIceberg catalog,
        when `since` is not an ancestor of `head`, or when delete files may hide rows of the
        files (their statistics would count deleted rows)."""
        if self.meta is None:
            return None
        from pyiceberg.manifest import ManifestContent

        table = self._meta_table(identifier)
        snap = table.metadata.snapshot_by_id(int(head))
        if snap is None:
            return None
        ours = None
        if since is not None:
            chain = _walk_parents({sn.snapshot_id: sn.parent_snapshot_id for sn in table.metadata.snapshots},
                                  int(head))
            if since not in chain:
                return None
            ours = set(chain[:chain.index(since)])
        files = []
        for manifest in snap.manifests(table.io):
            if manifest.content != ManifestContent.DATA:
                # older deletes never touch files added after them (equality deletes apply to
                # lower sequence numbers, position deletes name existing files)
                if (ours is None or manifest.added_snapshot_id in ours) and \
                        (manifest.has_added_files() or manifest.has_existing_files()):
                    return None
                continue
            if ours is not None and manifest.added_snapshot_id not in ours:
                continue
            files += [e.data_file for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                      if ours is None or e.snapshot_id in ours]
        return table.schema(), files

    @property
    def catalog_label(self) -> str:
        """host:port/db of the catalog database (never credentials), for outage messages."""
        from lakehouse.runtime.outage import describe_url

        engine = getattr(self.meta, "engine", None)
        return describe_url(engine.url.render_as_string(hide_password=True)) if engine is not None else self.catalog


class IcebergTables(CatalogTables):
    """Thin, explicit wrapper over Spark's Iceberg catalog for one catalog name: the Spark engine's
    tables handle (lakehouse.engines.spark).

    Data goes through Spark; table *metadata* (existence, refs, snapshot summaries) is read with
    PyIceberg (`CatalogTables`) when a PyIceberg catalog for the same catalog is given, which costs
    milliseconds instead of a Spark job per question; without one, Spark's metadata tables answer.
    """

    def __init__(self, spark: SparkSession | Callable[[], SparkSession], catalog: str, meta_catalog: Any | None = None):
        super().__init__(catalog, meta_catalog)
        self._spark = spark  # or a function giving it: metadata questions then need no JVM at all

    @property
    def spark(self) -> SparkSession:
        if callable(self._spark):
            self._spark = self._spark()
        return self._spark

    # ------------------------------------------------------------------ names
    def qualified(self, identifier: str, branch: str | None = None) -> str:
        ns, tbl = identifier.split(".", 1)
        name = f"{quote(self.catalog)}.{quote(ns)}.{quote(tbl)}"
        if branch and branch != MAIN:
            name += "." + quote(f"branch_{branch}")
        return name

    def metadata_table(self, identifier: str, which: str) -> str:
        ns, tbl = identifier.split(".", 1)
        return f"{quote(self.catalog)}.{quote(ns)}.{quote(tbl)}.{quote(which)}"

    # ------------------------------------------------------------------ DDL
    def exists(self, identifier: str) -> bool:
        return super().exists(identifier) if self.meta is not None else self._exists_by_spark(identifier)

    @_rides_out
    def _exists_by_spark(self, identifier: str) -> bool:
        ns, tbl = identifier.split(".", 1)
        return bool(
            self.spark.sql(f"SHOW TABLES IN {quote(self.catalog)}.{quote(ns)} LIKE {sql_string(tbl)}").count()
        ) if self.namespace_exists(ns) else False

    @_rides_out
    def namespace_exists(self, ns: str) -> bool:
        rows = self.spark.sql(f"SHOW NAMESPACES IN {quote(self.catalog)}").collect()
        return any(r[0] == ns for r in rows)

    @_rides_out
    def ensure_namespace(self, ns: str) -> None:
        try:
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(self.catalog)}.{quote(ns)}")
        except Exception:
            if not self.namespace_exists(ns):  # else another run created it at the same moment
                raise

    @_rides_out
    def ensure_table(self, target: Target, schema, *, wap: bool = True, properties: dict[str, str] | None = None
                     ) -> bool:
        """Create the table from metadata (schema, partition spec, sort order) if missing. True if created.
        `properties`: table properties the platform adds (the target's own win); an existing table
        gets those it lacks."""
        ident = target.identifier
        if self.exists(ident):  # then its namespace exists: no CREATE NAMESPACE statement for the JVM to plan
            if properties:
                self.ensure_properties(ident, {k: v for k, v in properties.items() if k not in target.table_properties})
            return False
        self.ensure_namespace(target.namespace)
        cols = ", ".join(f"{quote(f.name)} {ddl_type(f.dataType)}" for f in schema.fields)
        ddl = f"CREATE TABLE IF NOT EXISTS {self.qualified(ident)} ({cols}) USING iceberg"
        if target.partition_spec:
            ddl += " PARTITIONED BY (" + ", ".join(partition_expr(p) for p in target.partition_spec) + ")"
        props = {"format-version": "2", "write.wap.enabled": "true" if wap else "false", **(properties or {}),
                 **target.table_properties}
        ddl += " TBLPROPERTIES (" + ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in props.items()) + ")"
        try:
            self.spark.sql(ddl)
        except Exception:
            if self.exists(ident):
                return False  # another run created it at the same moment: theirs is the same table
            raise
        if target.sort_order:
            self.spark.sql(
                f"ALTER TABLE {self.qualified(ident)} WRITE ORDERED BY " + ", ".join(sort_expr(s) for s in target.sort_order)
            )
        log.info("created Iceberg table %s", ident)
        return True

    @_rides_out
    def ensure_properties(self, identifier: str, properties: dict[str, str]) -> None:
        """Set the table properties the table lacks (a metadata commit, no snapshot: main's data and
        every branch stay where they are); one already set, to any value, is left alone."""
        if self.meta is not None:
            have = self._meta_table(identifier).properties
        else:
            have = {r["key"]: r["value"] for r in self.spark.sql(f"SHOW TBLPROPERTIES {self.qualified(identifier)}").collect()}
        missing = {k: v for k, v in properties.items() if k not in have}
        if missing:
            self.spark.sql(f"ALTER TABLE {self.qualified(identifier)} SET TBLPROPERTIES ("
                           + ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in missing.items()) + ")")

    @_rides_out
    def add_missing_columns(self, identifier: str, schema) -> list[str]:
        """Schema evolution: add input columns the table lacks (never drops or retypes)."""
        existing = {f.name.lower() for f in self.spark.table(self.qualified(identifier)).schema.fields}
        added = []
        for f in schema.fields:
            if f.name.lower() not in existing:
                self.spark.sql(
                    f"ALTER TABLE {self.qualified(identifier)} ADD COLUMN {quote(f.name)} {ddl_type(f.dataType)}"
                )
                added.append(f.name)
        return added

    # ------------------------------------------------------------------ snapshots and refs
    def refs(self, identifier: str) -> dict[str, int]:
        return super().refs(identifier) if self.meta is not None else self._refs_by_spark(identifier)

    @_rides_out
    def _refs_by_spark(self, identifier: str) -> dict[str, int]:
        rows = self.spark.sql(f"SELECT name, snapshot_id FROM {self.metadata_table(identifier, 'refs')}").collect()
        return {r["name"]: r["snapshot_id"] for r in rows}

    def refs_if_exists(self, identifier: str) -> dict[str, int] | None:
        if self.meta is None:
            return self.refs(identifier) if self.exists(identifier) else None
        return super().refs_if_exists(identifier)

    def snapshot_summary(self, identifier: str, snapshot_id: int) -> dict[str, str]:
        if self.meta is not None:
            return super().snapshot_summary(identifier, snapshot_id)
        return self._summary_by_spark(identifier, snapshot_id)

    @_rides_out
    def _summary_by_spark(self, identifier: str, snapshot_id: int) -> dict[str, str]:
        rows = self.spark.sql(
            f"SELECT summary FROM {self.metadata_table(identifier, 'snapshots')} WHERE snapshot_id = {int(snapshot_id)}"
        ).collect()
        return dict(rows[0]["summary"]) if rows else {}

    def _new_head(self, identifier: str, branch: str, before: int | None) -> tuple[int | None, dict[str, str]]:
        if self.meta is not None:
            return super()._new_head(identifier, branch, before)
        after = self.snapshot_id(identifier, branch)
        return after, (self.snapshot_summary(identifier, after) if after is not None and after != before else {})

    def ancestors(self, identifier: str, snapshot_id: int | None) -> list[int]:
        if snapshot_id is None or self.meta is not None:
            return super().ancestors(identifier, snapshot_id)
        return self._ancestors_by_spark(identifier, snapshot_id)

    @_rides_out
    def _ancestors_by_spark(self, identifier: str, snapshot_id: int) -> list[int]:
        rows = self.spark.sql(
            f"SELECT snapshot_id, parent_id FROM {self.metadata_table(identifier, 'snapshots')}"
        ).collect()
        return _walk_parents({r["snapshot_id"]: r["parent_id"] for r in rows}, snapshot_id)

    @_rides_out
    def create_branch(self, identifier: str, branch: str) -> None:
        """Branch from main's current snapshot; an empty table first gets an empty main snapshot."""
        if self.snapshot_id(identifier, MAIN) is None:
            # Branches need a snapshot to point at. One Iceberg transaction (Java API, no Spark
            # job) gives main an empty snapshot and puts the branch on it: a single catalog commit.
            table = self.java_table(identifier)
            txn = table.newTransaction()
            txn.newFastAppend().commit()
            txn.manageSnapshots().createBranch(branch, txn.table().currentSnapshot().snapshotId()).commit()
            txn.commitTransaction()
            return
        self.spark.sql(f"ALTER TABLE {self.qualified(identifier)} CREATE BRANCH IF NOT EXISTS {quote(branch)}")

    @_rides_out
    def java_table(self, identifier: str):
        """The org.apache.iceberg.Table Spark's catalog loads for `identifier` (metadata operations
        Spark SQL has no statement for)."""
        return pyspark_compat.jvm(self.spark).org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            pyspark_compat.java_session(self.spark), self.qualified(identifier))

    def refresh_table(self, identifier: str) -> None:
        """Forget Spark's cached metadata of the table (before retrying a commit that conflicted)."""
        self.spark.catalog.refreshTable(self.qualified(identifier))

    def expire_snapshots(self, identifier: str, snapshot_ids: list[int]) -> None:
        """Expire these snapshots; Iceberg deletes the files only they referenced."""
        spark = self.spark
        action = pyspark_compat.jvm(spark).org.apache.iceberg.spark.actions.SparkActions.get(
            pyspark_compat.java_session(spark)) \
            .expireSnapshots(self.java_table(identifier)).expireOlderThan(1)  # keep everything else
        for sid in snapshot_ids:
            action = action.expireSnapshotId(int(sid))
        action.execute()

    @_rides_out
    def drop_branch(self, identifier: str, branch: str) -> None:
        if branch == MAIN:
            raise ValueError("refusing to drop the main branch")
        self.spark.sql(f"ALTER TABLE {self.qualified(identifier)} DROP BRANCH IF EXISTS {quote(branch)}")

    @_rides_out
    def read(self, identifier: str, branch: str = MAIN) -> DataFrame:
        """The table (or one branch of it) as a DataFrame.

        A branch this process just created was once (1 in ~160 test runs, two writers on one
        SQLite catalog) reported missing by Spark; while the catalog (read by PyIceberg) says the
        branch exists, the load is repeated (retry.BRANCH_LOAD) before that error is believed.
        """
        from lakehouse.runtime import retry

        def branch_exists(_exc: BaseException) -> bool:
            return branch != MAIN and self.snapshot_id(identifier, branch) is not None

        return retry.call(retry.BRANCH_LOAD, lambda: self.spark.table(self.qualified(identifier, branch)),
                          what=f"loading {identifier}@{branch}", also=branch_exists)

    # ------------------------------------------------------------------ writes
    def write(
        self,
        df: DataFrame,
        target: Target,
        *,
        branch: str = MAIN,
        snapshot_properties: dict[str, str] | None = None,
        mode: str | None = None,
        spec: WriteSpec | None = None,
    ) -> WriteResult:
        """Write `df` to the target (on `branch`) with the target's write mode, or as `spec` says;
        returns the new snapshot."""
        ident = target.identifier
        mode = spec.mode if spec is not None else (mode or target.write_mode)
        props = {f"snapshot-property.{k}": v for k, v in (snapshot_properties or {}).items()}
        name = self.qualified(ident, branch)
        before = self.snapshot_id(ident, branch)
        counts: dict[str, int] = {}
        if mode == "merge":
            counts = self.merge_counts(df, target, branch, spec)
            self._merge(df, target, branch, snapshot_properties or {}, spec)
        else:
            writer = df.writeTo(name)
            for k, v in props.items():
                writer = writer.option(k, v)
            if mode == "append":
                writer.append()
            elif mode == "overwrite":
                from pyspark.sql import functions as F

                writer.overwrite(spec.condition if spec is not None and spec.condition is not None else F.lit(True))
            elif mode == "overwrite_partitions":
                writer.overwritePartitions()
            else:
                raise ValueError(f"unknown write mode {mode!r}")
        after, summary = self._new_head(ident, branch, before)
        rows = int(summary.get("added-records", 0))
        return WriteResult(ident, branch, after, rows, mode, summary, **counts)

    def merge_counts(self, df: DataFrame, target: Target, branch: str, spec: WriteSpec | None = None
                     ) -> dict[str, int]:
        """What the MERGE of `df` will do, counted before it runs (Spark 3.5's MERGE INTO returns no
        row counts): its rows (`rows_in`), those whose key the branch lacks (`rows_inserted`) and
        those that replace a row (`rows_updated`: matched, and with `order_by` not older than the
        row). One pass over the change set joined with the branch's rows of its keys (read through
        the write's pruning predicate, as the MERGE reads them), with the MERGE's own key match."""
        from pyspark.sql import functions as F

        keys = spec.merge_keys if spec is not None and spec.merge_keys else target.merge_keys
        order_by = spec.order_by if spec is not None else None
        if self.snapshot_id(target.identifier, branch) is None:  # an empty branch: every row is new
            n = df.count()
            return {"rows_in": n, "rows_inserted": n, "rows_updated": 0, "rows_deleted": 0}
        t = self.read(target.identifier, branch)
        if spec is not None and spec.prune:
            t = t.alias("t").where(F.expr(spec.prune))
        tcols = [F.col(quote(k)).alias(f"__t{i}") for i, k in enumerate(keys)]
        if order_by:
            tcols.append(F.col(quote(order_by)).alias("__t_order"))
        t = t.select(*tcols, F.lit(True).alias("__t_hit"))
        on = None
        for i, k in enumerate(keys):
            part = F.col(quote(k)).eqNullSafe(F.col(f"__t{i}"))
            on = part if on is None else on & part
        joined = df.join(t, on, "left")
        hit = F.col("__t_hit").isNotNull()
        newer = F.coalesce(F.col(quote(order_by)) >= F.col("__t_order"), F.lit(True)) if order_by else F.lit(True)
        row = joined.agg(F.count(F.lit(1)).alias("n"),
                         F.sum(F.when(~hit, 1).otherwise(0)).alias("ins"),
                         F.sum(F.when(hit & newer, 1).otherwise(0)).alias("upd")).collect()[0]
        return {"rows_in": int(row["n"] or 0), "rows_inserted": int(row["ins"] or 0),
                "rows_updated": int(row["upd"] or 0), "rows_deleted": 0}

    def _merge(self, df: DataFrame, target: Target, branch: str, snapshot_properties: dict[str, str],
               spec: WriteSpec | None = None) -> None:
        view = f"lakehouse_merge_src_{abs(hash((target.target_id, branch))) % 10**9}"
        df.createOrReplaceTempView(view)
        keys = spec.merge_keys if spec is not None and spec.merge_keys else target.merge_keys
        on = " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)
        if spec is not None and spec.prune:
            on += f" AND ({spec.prune})"
        newer = ""
        if spec is not None and spec.order_by:  # an older row never replaces a newer one (a null: the new row wins)
            newer = f" AND coalesce(s.{quote(spec.order_by)} >= t.{quote(spec.order_by)}, true)"
        sql = (
            f"MERGE INTO {self.qualified(target.identifier, branch)} t USING {quote(view)} s ON {on} "
            f"WHEN MATCHED{newer} THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        )
        conf_keys = {f"spark.sql.iceberg.snapshot-property.{k}": v for k, v in snapshot_properties.items()}
        # Spark SQL has no per-statement snapshot properties: the session's commit properties carry them.
        for k, v in conf_keys.items():
            self.spark.conf.set(k, v)
        try:
            self._commit_properties(snapshot_properties, lambda: self.spark.sql(sql))
        finally:
            for k in conf_keys:
                self.spark.conf.unset(k)
            self.spark.catalog.dropTempView(view)

    def _commit_properties(self, props: dict[str, str], action) -> Any:
        """Run `action` with Iceberg CommitMetadata properties set (used for SQL writes like MERGE)."""
        if not props:
            return action()
        jvm = pyspark_compat.jvm(self.spark)
        jmap = jvm.java.util.HashMap()
        for k, v in props.items():
            jmap.put(k, v)
        holder: dict[str, Any] = {}

        class _Callable:
            def call(self_inner):
                holder["called"] = True
                try:
                    holder["result"] = action()
                except BaseException as exc:
                    holder["error"] = exc
                    raise
                return None

            class Java:
                implements = ["java.util.concurrent.Callable"]

        try:
            jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
                jmap, _Callable(), jvm.java.lang.RuntimeException().getClass()
            )
        except Exception:
            if "error" in holder:  # the action itself failed: its own error, and it never runs twice
                raise holder["error"] from None
            if holder.get("called"):
                raise
            # Py4J could not call back into Python (no callback server): the action has not run
            log.warning("commit properties via CommitMetadata unavailable (Py4J callbacks); running without "
                        "them", exc_info=True)
            holder["result"] = action()
        return holder.get("result")


def _ref_ids(metadata) -> dict[str, int]:
    """branch or tag name -> snapshot id, from PyIceberg table metadata."""
    return {name: ref.snapshot_id for name, ref in metadata.refs.items()}


def _summary_of(metadata, snapshot_id: int) -> dict[str, str]:
    """A snapshot's summary from PyIceberg table metadata ({} when the snapshot is not there)."""
    snap = metadata.snapshot_by_id(int(snapshot_id))
    if snap is None or snap.summary is None:
        return {}
    return {**snap.summary.additional_properties, "operation": snap.summary.operation.value}


def _walk_parents(parent: dict[int, int | None], start: int) -> list[int]:
    """`start` and its ancestors, newest first, through a snapshot id -> parent id map."""
    out, cur = [], start
    while cur is not None and cur in parent:
        out.append(cur)
        cur = parent[cur]
    return out


_PUBLISH_LOCKS: dict[tuple[str, str], Any] = {}
_PUBLISH_LOCKS_GUARD = threading.Lock()


def _publish_lock(catalog: str, identifier: str):
    with _PUBLISH_LOCKS_GUARD:
        return _PUBLISH_LOCKS.setdefault((catalog, identifier.lower()), threading.RLock())


def retry_metadata_commit(tables: CatalogTables, identifier: str, action):
    """Run a small metadata commit (create/drop branch, create table) that Iceberg does not retry
    itself: serialized per table in this process, repeated on a commit conflict or a busy catalog
    (retry.METADATA_COMMIT) against the table as it is now."""
    from lakehouse.runtime import retry

    def refresh(_exc: BaseException) -> None:
        if tables.exists(identifier):
            tables.refresh_table(identifier)

    with _publish_lock(tables.catalog, identifier):
        return retry.call(retry.METADATA_COMMIT, action, what=f"metadata commit on {identifier}",
                          before_retry=refresh)


def summary_json(summary: dict[str, str], key: str) -> Any:
    raw = summary.get(key)
    return json.loads(raw) if raw else None
