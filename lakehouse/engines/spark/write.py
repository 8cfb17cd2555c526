"""Write-audit-publish on one audit branch: the write and audit halves `lakehouse.stage.wap_service` drives.

Every batch goes to the Iceberg branch `audit_<run_id>` of the target (rows failing a
quarantine rule go to the same-named branch of the quarantine table), the rules run against
the branch, and only `publish` moves `main`. Until then readers of `main` see nothing of
this run: the only `main` change before publish is the empty first snapshot a brand-new
table needs to branch from, and (policy `evolve`) new nullable columns in the table schema.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakehouse.engines.audited import BranchWrite, QuarantineBranch
from lakehouse.sql.text import quote
from lakehouse.table.iceberg import IcebergTables, WriteResult, retry_metadata_commit
from lakehouse.validation.file_metrics import FileMetrics, answerable_keys
from lakehouse.validation.rules import (
    SCOPE_APPENDED,
    SCOPE_CHANGE_SET,
    SCOPE_INPUT,
    SCOPE_MERGED_KEYS,
    SCOPE_PARTITIONS,
    SCOPE_REPLACED,
    SCOPE_TABLE,
    CheckOutcome,
    RowPass,
    SchemaDrift,
    acting_rules,
    evaluate_rules,
    schema_drift,
    split_rows,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.stage.core import Batch, StageContext

log = logging.getLogger(__name__)


def _rule_may_be_at_fault(exc: BaseException) -> bool:
    """An error no classification explains (not corrupt input, I/O, memory, a conflict...): it may
    come from a rule's expression evaluated on the rows."""
    from lakehouse.errors import UNKNOWN, classify

    return classify(exc).code == UNKNOWN


class SparkAuditedWrite(BranchWrite):
    """One run's writes to one target on its audit branch, on Spark DataFrames: the schema contracts,
    the split by the acting rules, counts observed as the rows are written, and the audit of the new
    rows with their files' statistics (the branch bookkeeping and the publish: `BranchWrite`)."""

    def __init__(self, runner: StageContext, tables: IcebergTables, branch: str, *, quarantine: bool = True,
                 since: int | None | str = "now", prepare_branch: Callable[[IcebergTables, str], None] | None = None):
        super().__init__(runner, tables, branch, quarantine=quarantine, since=since, prepare_branch=prepare_branch)
        self._batches = 0
        self._handled = {r.name for r in acting_rules(self.rules)}
        self.observed: dict[str, Any] | None = None  # RowPass keys observed during the writes
        self._observation_ok = True
        self._observed_keyset: set[str] | None = None  # the same keys must be observed on every batch
        # the last write replaced the whole branch and its rows were observed: the observation then
        # covers every row the audit reads (the whole branch), as it does for appends
        self._observed_whole = False
        # what the writes that replaced data touched, as predicates over the table (a merge: its keys;
        # a partition overwrite: its condition), so the audit reads those rows, not the whole table;
        # None once a write replaced data without saying where (then the audit reads the whole branch)
        self._scopes: list | None = []
        self._appended = False
        self._change_set: DataFrame | None = None
        # the distinct keys each merge wrote (persisted until the audit, which reads exactly the
        # branch's rows of those keys) and what kinds of scoped writes there were
        self._merged_keys: list[tuple[tuple[str, ...], DataFrame]] = []
        self._scope_kinds: set[str] = set()

    # ------------------------------------------------------------------ write
    def _conform(self, df: DataFrame) -> DataFrame:
        """Apply the schema contracts: evolve adds new columns to the table, freeze and fail keep
        them off the branch (fail also fails the check). Without a contract the input is written
        as is, and Iceberg rejects columns the table lacks."""
        if not self.contracts:
            return self._align(df)
        for r in self.contracts:
            self.drift.setdefault(r.name, SchemaDrift()).merge(schema_drift(df, r))
        expected = {c.name.lower() for r in self.contracts for c in r.expected_columns}
        evolve = any(r.schema_policy == "evolve" for r in self.contracts)
        table_cols = ({f.name.lower() for f in self.tables.read(self.ident).schema.fields}
                      if self.tables.exists(self.ident) else None)
        added, ignored = [], []
        for c in df.columns:
            if c.startswith("_") or c.lower() in expected:
                continue
            if table_cols is not None and c.lower() in table_cols:
                continue
            (added if evolve else ignored).append(c)
        if ignored:
            df = df.drop(*ignored)
        if added and table_cols is not None:
            from pyspark.sql.types import StructType

            new = StructType([f for f in df.schema.fields if f.name in added])
            retry_metadata_commit(self.tables, self.ident, lambda: self.tables.add_missing_columns(self.ident, new))
        # files reconciled one by one before the write (lakehouse.ingest.prepare): what they added, which quarantined
        report = self.runner.report
        added += [c for c in report.get("schema_added_columns", []) if c not in added]
        for d in self.drift.values():
            d.added.extend(c for c in added if c not in d.added)
            d.ignored.extend(c for c in ignored if c not in d.ignored)
            d.quarantined.extend(q for q in report.get("schema_quarantined", []) if q not in d.quarantined)
        return self._align(df)

    def _align(self, df: DataFrame) -> DataFrame:
        if not self.tables.exists(self.ident):
            return df
        return align_to_table(df, self.tables.read(self.ident).schema)

    def write(self, batch: Batch) -> WriteResult:
        from pyspark import StorageLevel

        df = self._conform(batch.df)
        split = split_rows(df, self.rules, self.actions.errors if self.actions is not None else None)
        tagged = split.tagged.persist(StorageLevel.MEMORY_AND_DISK) if split.tagged is not None else None
        try:
            on_writes = tagged is not None and self._actions_ride_on_writes(split, batch)
            if tagged is not None and self.actions is not None and not on_writes:
                self.actions.add(tagged, self.rules)
            quarantined, counts = 0, None
            if split.quarantine is not None and self.quarantine_enabled:
                bad = split.quarantine
                if on_writes:  # the rules' counts among the quarantined rows, taken as they are written
                    from pyspark.sql import Observation

                    self._batches += 1
                    counts = Observation(f"quarantine_{self.branch}_{self._batches}")
                    bad = bad.observe(counts, *self.actions.aggregates(self.rules))
                # the batch's file checkpoints ride along: quarantine rows are published exactly once too
                quarantined = self._quarantine_writer().write(bad, batch.snapshot_properties)
                self.quarantined_rows += quarantined
            keep = split.keep
            if not self.created:
                self._start_branch(keep.schema)
            row_pass = RowPass.plan(keep, self.rules, self._handled)
            replaces_all = self._replaces_all(batch)
            batch = self._scoped(batch, keep)
            # not into a table with a write order: Iceberg asks Spark for a range distribution,
            # whose sampling job runs the plan a second time, and observed counts would double
            observe = (self.target.write_mode == "append" or replaces_all) and not self.target.sort_order
            keys = self._observed_keys(row_pass, keep) if observe else set()
            if replaces_all:  # what earlier batches wrote is gone: their observations with it
                self.observed, self._observed_keyset, self._observation_ok = None, None, True
            self._observed_whole = False
            if self._observed_keyset is None:
                self._observed_keyset = keys
            elif keys != self._observed_keyset:
                self._observation_ok = False  # batches observed different keys: none covers the run
            res, observation = self._write_branch(keep, batch, row_pass.aggregates(keys) if keys else [])
            if observation is None:
                pass  # nothing to observe: the file statistics answer every row rule
            elif res.rows_written == 0:
                # nothing committed: Spark may have pruned the plan, and Observation.get would wait
                # forever for metrics that never come; the audit counts on the branch instead
                self._observation_ok = False
            elif self._observation_ok:
                self.observed = RowPass.merge(self.observed, observation.get)
                self._observed_whole = replaces_all
            if on_writes:
                # every input row is either kept (appended: the commit's added-records) or quarantined;
                # no quarantined row committed means no row failed a quarantine rule (nothing to observe)
                self.actions.record(res.rows_written + quarantined, counts.get if quarantined else {},
                                    tagged, self.rules)
        finally:
            if tagged is not None:
                tagged.unpersist()
            if self._change_set is not None:  # persisted by _scoped for a merge
                self._change_set.unpersist()
                self._change_set = None
        if res.operation != "append":
            self.appends_only = False
        else:
            self._appended = True
        return res

    def _actions_ride_on_writes(self, split, batch: Batch) -> bool:
        """Whether the drop/quarantine rules' counts can be taken from the batch's two writes instead
        of their own pass over the rows: only when every acting rule quarantines (a dropped row is in
        neither write) and the kept rows are appended (a commit's added-records is then their count)."""
        if self.actions is None or split.quarantine is None or not self.quarantine_enabled:
            return False
        acting = [r for r in acting_rules(self.rules) if r.name not in self.actions.errors]
        return (all(r.action == "quarantine" for r in acting) and batch.write is None
                and self.target.write_mode == "append")

    def _replaces_all(self, batch: Batch) -> bool:
        """The batch's write replaces every row of the branch (a full recompute, an overwrite target
        without a condition): afterwards the branch holds exactly the rows written."""
        spec = batch.write
        if spec is None:
            return self.target.write_mode == "overwrite"
        return spec.mode == "overwrite" and spec.condition is None

    def _scoped(self, batch: Batch, keep: DataFrame) -> Batch:
        """Record where this batch's write lands in the table (`_scopes`); a merge also gets the
        pruning predicate of its keys, so MERGE reads only the files those keys can be in."""
        spec = batch.write
        # a merge target: its audit is scoped by the merged keys as well, but its MERGE is left as it
        # was (its input may carry non-deterministic columns, `_ingested_at`, which Spark refuses in a
        # MERGE whose condition has a pruning predicate)
        as_target = spec is None and self.target.write_mode == "merge"
        if as_target:
            from lakehouse.table.iceberg import WriteSpec

            spec = WriteSpec("merge", tuple(self.target.merge_keys))
        if spec is None:
            if self.target.write_mode != "append":
                self._scopes = None
            return batch
        if spec.mode == "merge":
            from pyspark import StorageLevel

            from lakehouse.stage.pruning import KeyScope

            self._change_set = keep.persist(StorageLevel.MEMORY_AND_DISK)  # its keys are read, then it is merged
            keys = tuple(spec.merge_keys or self.target.merge_keys)
            scope = KeyScope.collect(keep, keys)
            if self._scopes is not None:
                self._scopes.append(scope.column())
                merged = keep.select(*[quote(k) for k in keys]).distinct().persist(StorageLevel.MEMORY_AND_DISK)
                merged.count()  # materialized now: the change set it comes from is released after the write
                self._merged_keys.append((keys, merged))
                self._scope_kinds.add("merge")
            if as_target:
                return batch
            return dataclasses.replace(batch, write=dataclasses.replace(spec, prune=scope.sql("t")))
        if spec.mode == "overwrite" and spec.condition is not None:
            if self._scopes is not None:
                self._scopes.append(spec.condition)
                self._scope_kinds.add("partitions")
            return batch
        self._scopes = None
        return batch

    def _scope(self):
        """The predicate selecting every row this run's writes replaced or added, or None when
        only the whole branch covers them (an unscoped replacement, or appends mixed in)."""
        if self.appends_only or self._appended or not self._scopes:
            return None
        return functools.reduce(operator.or_, self._scopes)

    def _observed_keys(self, row_pass: RowPass, keep: DataFrame) -> set[str]:
        """RowPass keys to count on the rows as they are written: those the new files'
        statistics cannot answer (with a PyIceberg catalog to read them, which the platform has)."""
        if self.tables.meta is None:
            return row_pass.keys()
        from lakehouse.engines.types import arrow_schema

        try:
            schema = arrow_schema(keep.schema)  # the platform's type model, at the Spark edge
        except ValueError:  # a type with no Arrow form: every key is counted on the rows
            return row_pass.keys()
        return row_pass.keys() - answerable_keys(row_pass, schema)

    def _write_branch(self, keep: DataFrame, batch: Batch, aggregates: list):
        """Append to the branch; row-rule counts the file statistics cannot give ride on the
        write (`DataFrame.observe`). A commit that failed on a busy catalog or a commit conflict,
        or because the catalog database was briefly down (lakehouse.runtime.outage), is repeated
        (retry.BRANCH_WRITE) only while the branch head did not move, so a commit that did land is
        never written twice."""
        head = self.tables.snapshot_id(self.ident, self.branch)
        try:
            return self._write_branch_retried(keep, batch, aggregates, head)
        except Exception as exc:  # noqa: BLE001 - only a rule's failing count is handled here
            if not (aggregates and _rule_may_be_at_fault(exc)
                    and self.tables.snapshot_id(self.ident, self.branch) == head):
                raise
            # a rule's count broke the observed write: write without it; the audit then counts on the
            # rows, rule by rule, and only that rule's check ends in error
            text = str(exc).strip()
            log.warning("write to %s@%s with the rules' observed counts failed (%s); writing without them",
                        self.ident, self.branch, text.splitlines()[0][:200] if text else exc)
            self._observation_ok = False
            return self._write_branch_retried(keep, batch, [], head)

    def _write_branch_retried(self, keep: DataFrame, batch: Batch, aggregates: list, head: int | None):
        from lakehouse.runtime import retry
        from lakehouse.runtime.outage import is_connection_failure

        def write():
            observation = None
            frame = keep
            if aggregates:
                from pyspark.sql import Observation

                self._batches += 1
                observation = Observation(f"audit_{self.branch}_{self._batches}")
                frame = keep.observe(observation, *aggregates)
            res = self.tables.write(frame, self.target, branch=self.branch,
                                    snapshot_properties=batch.snapshot_properties, spec=batch.write)
            return res, observation

        def head_unmoved(exc: BaseException) -> bool:  # and not a rule's count, which _write_branch handles
            return (not (aggregates and _rule_may_be_at_fault(exc))
                    and self.tables.snapshot_id(self.ident, self.branch) == head)

        return retry.call(retry.BRANCH_WRITE, write, what=f"write to {self.ident}@{self.branch}",
                          also=is_connection_failure, only=head_unmoved)

    def _new_quarantine(self) -> SparkQuarantineWriter:
        return SparkQuarantineWriter(self.runner, self.tables, self.branch)

    # ------------------------------------------------------------------ audit
    def new_rows(self, branch_df: DataFrame | None = None) -> DataFrame:
        """The rows this run adds: an incremental read of the branch's own appends; when writes
        replaced data, the branch's rows where they wrote (a merge: the rows of the merged keys, read
        through their pruning predicate; a partition overwrite: the rows of those partitions), or
        the whole branch when a write did not say where (`branch_df` itself, when given: the audit
        then sees that its rows and its table are one frame, and counts them in one pass)."""
        head = self.tables.snapshot_id(self.ident, self.branch)
        if branch_df is None:
            branch_df = self.tables.read(self.ident, self.branch)
        if not self.appends_only:
            scope = self._scope()
            if scope is None:
                return branch_df
            rows = branch_df.where(scope)
            keysets = {k for k, _ in self._merged_keys}
            if self._scope_kinds == {"merge"} and len(keysets) == 1:
                # the predicate selects every row of those keys and maybe more (a key's columns are
                # scoped one by one, or by their bounds only): the merged keys themselves say which
                from pyspark.sql import functions as F

                keys = next(iter(keysets))
                merged = functools.reduce(lambda a, b: a.union(b), [f for _, f in self._merged_keys]).distinct()
                merged = merged.select(*[F.col(quote(k)).alias(f"__k{i}") for i, k in enumerate(keys)])
                on = functools.reduce(operator.and_, [F.col(quote(k)).eqNullSafe(F.col(f"__k{i}"))
                                                      for i, k in enumerate(keys)])
                rows = rows.join(merged, on, "left_semi")
            return rows
        if head is None or head == self.fork_snapshot:
            return branch_df.limit(0)
        reader = self.tables.spark.read.format("iceberg").option("end-snapshot-id", str(head))
        if self.fork_snapshot is not None:
            reader = reader.option("start-snapshot-id", str(self.fork_snapshot))
        return reader.load(f"{self.tables.catalog}.{self.ident}")

    def content_fingerprint(self, snapshot_id: int) -> tuple | None:
        """count(*) and sum(xxhash64(row)) of the snapshot's rows, one Spark aggregate."""
        from pyspark.sql import functions as F

        df = self.tables.spark.read.format("iceberg").option("snapshot-id", str(snapshot_id)) \
            .load(f"{self.tables.catalog}.{self.ident}")
        row = df.agg(F.count(F.lit(1)).alias("n"),
                     F.sum(F.xxhash64(*[F.col("`" + c.replace("`", "``") + "`") for c in df.columns]).cast("decimal(38,0)")).alias("h")).first()
        return (tuple(df.columns), row["n"], row["h"])

    def context(self) -> dict[str, Any]:
        refs = {}
        for r in self.rules:
            if r.type == "referential_integrity" and r.ref_dataset:
                cat = self.runner.catalog
                ref = next((t for t in cat.targets if r.ref_dataset in (t.target_id, t.identifier if t.kind == "iceberg"
                                                                         else None)), None)
                if ref is not None and ref.kind == "iceberg" and self.tables.exists(ref.identifier):
                    refs[r.ref_dataset] = self.tables.read(ref.identifier)
        return {
            "table": self.tables.read(self.ident, self.branch),
            "previous_row_count": self.previous_rows,
            "row_count_after": self._total_records(self.branch),
            "ref_frames": refs,
            "row_actions": self.actions,
            "schema_drift": self.drift,
            "observed": (self.observed if self._observation_ok and (self.appends_only or self._observed_whole)
                         else None),
            # a scoped write: `unique` checks the keys of the rows it wrote against the whole table
            "unique_scoped": self._scope() is not None,
            "scope": self._rows_scope(),
            "input_scope": SCOPE_CHANGE_SET if self._merged_keys else SCOPE_INPUT,
            "file_metrics": self.file_metrics(),
        }

    def file_metrics(self) -> FileMetrics | None:
        """Statistics of the files holding `new_rows()`: the branch's own appends, or every live
        file of the branch when a write replaced data. None when they cannot be read."""
        head = self.tables.snapshot_id(self.ident, self.branch)
        if head is None or self._scope() is not None:  # scoped rows: the files hold others too
            return None
        try:
            found = self.tables.data_files(self.ident, head, self.fork_snapshot if self.appends_only else None)
            return None if found is None else FileMetrics.from_data_files(*found)
        except Exception as exc:  # noqa: BLE001 - the rows give the same answers, only slower
            log.warning("%s@%s: file statistics unreadable (%s); the audit counts on the rows instead",
                        self.ident, self.branch, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            return None

    def _rows_scope(self) -> str:
        """What `new_rows` reads, in words (CheckOutcome.scope)."""
        if self.appends_only:
            return SCOPE_APPENDED
        if self._scope() is None:
            return SCOPE_TABLE
        return {frozenset({"merge"}): SCOPE_MERGED_KEYS, frozenset({"partitions"}): SCOPE_PARTITIONS}.get(
            frozenset(self._scope_kinds), SCOPE_REPLACED)

    def audit(self) -> list[CheckOutcome]:
        try:
            context = self.context()
            return evaluate_rules(self.new_rows(context["table"]), self.rules, context=context)
        finally:
            for _, keys in self._merged_keys:
                keys.unpersist()
            self._merged_keys = []


def align_to_table(df: DataFrame, table_schema) -> DataFrame:
    """Add the table's columns the input lacks as typed NULLs (Iceberg writes resolve by name)."""
    from pyspark.sql import functions as F

    have = {c.lower() for c in df.columns}
    for f in table_schema.fields:
        if f.name.lower() not in have:
            df = df.withColumn(f.name, F.lit(None).cast(f.dataType))
    return df


class SparkQuarantineWriter(QuarantineBranch):
    """Quarantined Spark rows to the quarantine table's branch (lakehouse.validation.quarantine)."""

    def write(self, bad: DataFrame, batch_properties: dict[str, str] | None = None) -> int:
        from pyspark.sql import functions as F

        rows = (bad.withColumn("_run_id", F.lit(self.runner.run_id))
                .withColumn("_quarantined_at", F.current_timestamp())
                .withColumn("_quarantine_id", F.expr("uuid()")))
        return self.append(rows, rows.schema, batch_properties)

    def align(self, rows: DataFrame) -> DataFrame:
        """The table's columns the rows lack, as typed NULLs (Spark's writer resolves by name)."""
        return align_to_table(rows, self.tables.read(self.ident).schema)
