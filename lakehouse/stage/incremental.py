"""Incremental stages: a run reads what its upstream committed since the run before, not all of it.

A SQL stage with an `incremental` block (model.Incremental) over one upstream table runs its SQL,
unchanged, over less: the upstream's name resolves to

* `merge`: the rows appended upstream after the snapshot the target last consumed, up to the
  snapshot the extract pinned (Iceberg's incremental append read, `start-snapshot-id` /
  `end-snapshot-id`); the output, one row per key (`order_by`: the newest), is merged into the
  target on `merge_keys`;
* `partitions`: the upstream rows of every partition the upstream's changes touched, in full
  (the touched partitions come from Iceberg's changelog, `<table>.changes`, both the rows added
  and the rows removed); the output replaces exactly those partitions of the target.

**Exactly once.** The upstream snapshot a run read up to is recorded in the target's snapshot
summary as `lakehouse.consumed.<upstream>` by the same commit as the data (the key
lakehouse.table.maintenance honours: expiry never removes a snapshot a consumer still needs). A run
decides what to read against its audit branch's fork: the branch is made before the mark is read,
and the publish fast-forwards only while main is still that fork (a merge or an overwrite is never
rebased, lakehouse.table.publish); when another run published meanwhile, the runner writes again on the
new main, whose mark then says what is consumed. A crash before the publish leaves data and mark
where they were (the next run reads the same range again); a crash after it, both moved together.

**Falling back.** When the range cannot be read incrementally the stage recomputes in full
(overwrite, and the mark moves to the pinned snapshot) and says why, in the audit log (event
`incremental`, outcome `fallback_full`) and in the run's metadata (`incremental`): no mark yet
(first run), the consumed snapshot is gone (expired) or no longer an ancestor (history rewritten
or rolled back), an upstream snapshot in the range is not of a kind the mode can follow (merge:
anything but an append, as the append read would silently skip it; partitions: any operation other
than append, overwrite and delete), the changelog cannot be read (delete files), or the upstream was
read from a replica.

**File rewrites are no change.** A snapshot whose operation is `replace` (compaction's
rewrite_data_files, rewrite_manifests: lakehouse.table.maintenance) rewrote files and changed no row, by
Iceberg's definition of the operation. Every mode steps over it (REWRITES): Iceberg's incremental
append read and its changelog skip it themselves, reading only the files the later appends added
(and the rows the later overwrites and deletes changed), so the change set and the touched
partitions are those of the range without it; a range of rewrites only is nothing new. The same holds
for an upstream read in full beside the incremental one: rewritten files alone are not a change of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.errors import ConfigurationError
from lakehouse.metadata import periods
from lakehouse.metadata.periods import Period
from lakehouse.stage.core import Batch, ExtractPlan, StageContext
from lakehouse.table.iceberg import WriteSpec, _walk_parents, branch_name_for_run, retry_metadata_commit

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from lakehouse.metadata.model import Incremental

#: `lakehouse.consumed.<upstream namespace.table>` = the upstream snapshot id read up to
CONSUMED_PREFIX = "lakehouse.consumed."
#: how the commit was computed: merge | partitions | full
MODE_PROPERTY = "lakehouse.stage.incremental"
MERGE, PARTITIONS, FULL, NOTHING = "merge", "partitions", "full", "nothing"
#: the upstream snapshot operations each mode reads incrementally; any other means a full recompute
FOLLOWS = {MERGE: frozenset({"append"}), PARTITIONS: frozenset({"append", "overwrite", "delete"})}
#: snapshot operations that only rewrite files (compaction, manifest rewrite), changing no row: every mode skips them
REWRITES = frozenset({"replace"})

#: the run tags a partitioned Dagster run carries (one day, or a range of them in a single-run backfill);
#: `lakehouse backfill` sets the range ones too
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
WINDOW = "window"

#: snapshot id -> (parent id, operation)
SnapshotGraph = Mapping[int, tuple[int | None, str]]


@dataclass(frozen=True)
class Decision:
    """What one run of an incremental stage reads: the range (consumed, end] of `upstream`, how."""

    mode: str  # merge | partitions | full | nothing
    upstream: str
    consumed: int | None
    end: int | None
    reason: str = ""
    #: snapshots in the range that only rewrote files (REWRITES), stepped over
    rewrites: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.mode == FULL:
            return f"full recompute of {self.upstream} up to snapshot {self.end}: {self.reason}"
        if self.mode == NOTHING:
            return f"nothing new in {self.upstream}: {self.reason}"
        return f"{self.mode}: {self.upstream} snapshots after {self.consumed} up to {self.end}" + (
            f" ({self.reason})" if self.reason else "")


def _marks_of(snap: Any) -> dict[str, int]:
    props = snap.summary.additional_properties if snap.summary is not None else {}
    return {k[len(CONSUMED_PREFIX):]: int(v) for k, v in props.items()
            if k.startswith(CONSUMED_PREFIX) and v.lstrip("-").isdigit()}


def marks_snapshot(md: Any, head: int | None) -> int | None:
    """The newest snapshot from `head` back that carries consumed marks (the stage's last write; a
    compaction after it has none), or None. Expiry keeps it (lakehouse.table.maintenance): without it the
    table's next incremental run would not know what it consumed."""
    if head is None:
        return None
    parents = {s.snapshot_id: s.parent_snapshot_id for s in md.snapshots}
    for sid in _walk_parents(parents, head):
        if _marks_of(md.snapshot_by_id(sid)):
            return sid
    return None


def consumed_marks(md: Any, head: int | None) -> dict[str, int]:
    """{upstream: snapshot id} the table consumed as of its snapshot `head`: the marks of
    marks_snapshot (the stage's last write, also behind a later compaction's snapshot)."""
    sid = marks_snapshot(md, head)
    return {} if sid is None else _marks_of(md.snapshot_by_id(sid))


def snapshot_graph(md: Any) -> dict[int, tuple[int | None, str]]:
    """The snapshots of a PyIceberg TableMetadata as {id: (parent, operation)}."""
    return {s.snapshot_id: (s.parent_snapshot_id, s.summary.operation.value if s.summary is not None else "unknown")
            for s in md.snapshots}


def decide(graph: SnapshotGraph, mode: str, upstream: str, consumed: int | None, end: int | None) -> Decision:
    """How to read `upstream` from the snapshot consumed last to the pinned `end` (pure: metadata only)."""
    def full(reason: str) -> Decision:
        return Decision(FULL, upstream, consumed, end, reason)

    if consumed is None:
        return full("no snapshot of it consumed yet (first incremental run)")
    if end is None:
        return full("it has no snapshot")
    if consumed == end:
        return Decision(NOTHING, upstream, consumed, end, f"snapshot {end} was consumed already")
    if consumed not in graph:
        return full(f"snapshot {consumed}, consumed last, is gone (expired)")
    parents = {sid: p for sid, (p, _) in graph.items()}
    chain = _walk_parents(parents, end)  # newest first
    if consumed not in chain:
        if end in _walk_parents(parents, consumed):
            return Decision(NOTHING, upstream, consumed, end, f"a later snapshot ({consumed}) was consumed already")
        return full(f"snapshot {consumed}, consumed last, is not an ancestor of {end} (history rewritten or "
                    "rolled back)")
    rewrites: list[int] = []
    for sid in reversed(chain[:chain.index(consumed)]):
        op = graph[sid][1]
        if op in REWRITES:
            rewrites.append(sid)
        elif op not in FOLLOWS[mode]:
            return full(f"snapshot {sid} is a {op}, which {mode} mode cannot follow (it reads "
                        f"{' / '.join(sorted(FOLLOWS[mode]))} only)")
    steps = _rewrites_text(rewrites)
    if rewrites and len(rewrites) == chain.index(consumed):
        return Decision(NOTHING, upstream, consumed, end, f"{steps}, no row changed", tuple(rewrites))
    return Decision(mode, upstream, consumed, end, f"{steps}: stepped over" if rewrites else "", tuple(rewrites))


def _rewrites_text(rewrites: list[int]) -> str:
    shown = ", ".join(map(str, rewrites[:5])) + (f" and {len(rewrites) - 5} more" if len(rewrites) > 5 else "")
    return (f"snapshot{'s' if len(rewrites) > 1 else ''} {shown} only rewrote files (compaction or manifest "
            "rewrite, operation replace)")


def only_rewrites(graph: SnapshotGraph, since: int, end: int) -> bool:
    """Whether `since` is an ancestor of `end` and every snapshot after it only rewrote files."""
    chain = _walk_parents({sid: p for sid, (p, _) in graph.items()}, end)
    return since in chain and all(graph[sid][1] in REWRITES for sid in chain[:chain.index(since)])


def _in(column: Column, values: list) -> Column:
    """`column IN values`, nulls included when a value is null (IN never matches a null)."""
    from pyspark.sql import functions as F

    present = [v for v in values if v is not None]
    cond = column.isin(present) if present else F.lit(False)
    return cond | column.isNull() if len(present) < len(values) else cond


def partition_rows(rows: DataFrame, expression: str | None, column: str, values: list) -> DataFrame:
    """The upstream rows whose partition value (`expression`, or the column itself) is one of
    `values`. When that is the day of a date/timestamp column, the days also become ranges of the
    column, which Iceberg prunes files by: a day's recompute reads that day, not the whole table.
    (An expression alone is not pushed down to the scan.)"""
    from pyspark.sql import functions as F

    from lakehouse.stage.pruning import day_column, day_ranges

    cond = _in(F.expr(expression) if expression else F.col(column), values)
    ranges = day_ranges(rows, day_column(expression, column), values)
    return rows.where(cond if ranges is None else ranges & cond)


def partition_window(ctx: StageContext) -> tuple[Period, Period] | None:
    """The periods (days, hours or months) a run of a time-partitioned target rewrites (from its
    partition run tags: Dagster partition keys), or None."""
    tp = ctx.target.time_partition
    tags = ctx.run_tags
    if tp is None or not (PARTITION_TAG in tags or RANGE_START_TAG in tags):
        return None
    first, last = (tags[PARTITION_TAG],) * 2 if PARTITION_TAG in tags else (tags[RANGE_START_TAG], tags[RANGE_END_TAG])
    g = tp.granularity
    try:
        start, end = periods.parse(g, first), periods.parse(g, last)
    except ValueError as exc:
        raise ConfigurationError(f"{ctx.target.identifier}: partition {first!r}..{last!r} is not a range of "
                                 f"{g}s: {exc}") from None
    lowest = periods.first(g, tp.start_date)
    if end < start or start < lowest:
        raise ConfigurationError(f"{ctx.target.identifier}: cannot rewrite {g}s {periods.key(g, start)}.."
                                 f"{periods.key(g, end)}: the range must run forwards and start on or after the "
                                 f"first partition, {periods.key(g, lowest)}")
    return start, end


class IncrementalRead:
    """One run of an incremental SQL stage: decide, resolve the upstream, yield the one batch."""

    def __init__(self, ctx: StageContext, plan: ExtractPlan,
                 run_sql: Callable[[StageContext, ExtractPlan, Mapping[str, DataFrame] | None], DataFrame]):
        self.ctx, self.plan, self.run_sql = ctx, plan, run_sql
        self.inc: Incremental | None = ctx.stage.incremental
        self.tables = ctx.platform.tables()
        self.ident = ctx.target.identifier
        ups = plan.upstream_snapshots
        named = self.inc.upstream if self.inc is not None and len(ups) > 1 else None
        driving = [k for k in ups if len(ups) == 1 or (named is not None and k.lower() == named)]
        if len(driving) != 1:
            raise ConfigurationError(
                f"stage {ctx.stage.pipeline_id}.{ctx.stage.stage_name} is incremental but reads "
                f"{sorted(ups) or 'no table'}" + (f", not {named!r} (its incremental.upstream)" if named else
                                                  " and does not say which one it reads incrementally") +
                ". Fix: set incremental.upstream to one of the tables its SQL reads, or remove `incremental`")
        self.upstream = driving[0]
        self.end = ups[self.upstream]
        #: upstreams read in full beside it (a dimension): any change to one means a full recompute
        self.others = {k: v for k, v in ups.items() if k != self.upstream}

    def _fork(self) -> int | None:
        """Make the run's audit branch now, so the mark is read on the snapshot the publish
        compares and swaps against (None: no target table yet)."""
        if not self.tables.exists(self.ident):
            return None
        branch = branch_name_for_run(self.ctx.run_id)
        retry_metadata_commit(self.tables, self.ident, lambda: self.tables.create_branch(self.ident, branch))
        return self.tables.snapshot_id(self.ident, branch)

    def _from_replica(self, upstream: str | None = None) -> bool:
        return (upstream or self.upstream) in self.plan.details.get("table_overrides", {})

    def decide(self, fork: int | None) -> Decision:
        if self._from_replica():
            return Decision(FULL, self.upstream, None, self.end, "it was read from its replica")
        cat = self.ctx.platform.pyiceberg_catalog()
        marks = consumed_marks(cat.load_table(self.ident).metadata, fork) if fork else {}
        consumed = marks.get(self.upstream)
        if consumed is not None:
            for other, snap in sorted(self.others.items()):
                full = self._other_changed(other, marks.get(other), snap)
                if full:
                    return Decision(FULL, self.upstream, consumed, self.end, full)
        graph = snapshot_graph(cat.load_table(self.upstream).metadata) if consumed is not None else {}
        return decide(graph, self.inc.mode, self.upstream, consumed, self.end)

    def _other_changed(self, other: str, consumed: int | None, now: int | None) -> str:
        """Why an upstream read in full beside the incremental one forces a full recompute ('' if not):
        the output's rows from old input rows may depend on it, and only a recompute reads them again."""
        if self._from_replica(other):
            return f"{other}, read in full beside it, was read from its replica (its snapshots cannot be compared)"
        if consumed == now:
            return ""
        if consumed is None:
            return f"{other}, read in full beside it, has no consumed snapshot recorded (it is at {now})"
        if now is not None and only_rewrites(
                snapshot_graph(self.ctx.platform.pyiceberg_catalog().load_table(other).metadata), consumed, now):
            return ""  # compacted or its manifests rewritten since: the same rows
        return (f"{other}, read in full beside it, changed since the run before (snapshot {consumed} -> {now}): "
                "rows computed from it earlier may be stale")

    def _newest(self, out: DataFrame) -> DataFrame:
        """merge with order_by: one row per key, the newest (in a change set and in a full recompute
        alike, so both give the same table)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        if self.inc is None or self.inc.mode != MERGE or not self.inc.order_by:
            return out
        w = Window.partitionBy(*self.inc.merge_keys).orderBy(F.col(self.inc.order_by).desc_nulls_first())
        return out.withColumn("__lh_rank", F.row_number().over(w)).where("__lh_rank = 1").drop("__lh_rank")

    def _props(self) -> dict[str, str]:
        return {"lakehouse.upstream": json.dumps(dict(self.plan.upstream_snapshots), separators=(",", ":")),
                "lakehouse.run_id": self.ctx.run_id}

    def _reader(self, **options: int):
        reader = self.ctx.platform.spark().read.format("iceberg")
        for k, v in options.items():
            reader = reader.option(k.replace("_", "-"), str(v))
        return reader

    def _touched(self, d: Decision) -> list:
        """partition_column values of every upstream row the range added or removed (the changelog)."""
        from pyspark.sql import functions as F

        cat = self.ctx.platform.settings.catalog_name
        changes = self._reader(start_snapshot_id=d.consumed, end_snapshot_id=d.end).load(
            f"{cat}.{self.upstream}.changes")
        expr = F.expr(self.inc.upstream_partition) if self.inc.upstream_partition else F.col(self.inc.partition_column)
        return [r[0] for r in changes.select(expr.alias("p")).distinct().collect()]

    def batches(self) -> Iterator[Batch]:
        from pyspark.sql import functions as F

        fork = self._fork()
        d = self.decide(fork)
        touched: list = []
        if d.mode == PARTITIONS:
            try:
                touched = self._touched(d)
            except Exception as exc:  # noqa: BLE001 - e.g. delete files: the changelog cannot say, recompute all
                text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                d = Decision(FULL, d.upstream, d.consumed, d.end, f"its changelog is unreadable: {text}", d.rewrites)
            else:
                if not touched:
                    d = Decision(NOTHING, d.upstream, d.consumed, d.end, "its new snapshots changed no rows", d.rewrites)
        self._report(d, touched)
        if d.mode == NOTHING:
            if fork is not None:
                self.tables.drop_branch(self.ident, branch_name_for_run(self.ctx.run_id))
            return
        props = {**self._props(), MODE_PROPERTY: d.mode}
        for up, snap in ((self.upstream, self.end), *self.others.items()):
            if snap is not None and not self._from_replica(up):  # a replica's snapshot ids are not the upstream's
                props[CONSUMED_PREFIX + up] = str(snap)
        cat = self.ctx.platform.settings.catalog_name
        if d.mode == FULL:
            yield Batch(self._newest(self.run_sql(self.ctx, self.plan, None)), props, label="sql (full recompute)",
                        write=WriteSpec("overwrite"))
        elif d.mode == MERGE:
            changed = self._reader(start_snapshot_id=d.consumed, end_snapshot_id=d.end).load(f"{cat}.{self.upstream}")
            out = self._newest(self.run_sql(self.ctx, self.plan, {self.upstream: changed}))
            yield Batch(out, props, label="sql (merge of the change set)",
                        write=WriteSpec(MERGE, tuple(self.inc.merge_keys), self.inc.order_by))
        else:
            rows = partition_rows(self._reader(snapshot_id=d.end).load(f"{cat}.{self.upstream}"),
                                  self.inc.upstream_partition, self.inc.partition_column, touched)
            out = self.run_sql(self.ctx, self.plan, {self.upstream: rows})
            yield Batch(out, props, label=f"sql ({len(touched)} partition(s) recomputed)",
                        write=WriteSpec("overwrite", condition=_in(F.col(self.inc.partition_column), touched)))

    def window_batches(self, start: Period, end: Period) -> Iterator[Batch]:
        """A run for periods start..end (days, hours or months) of a time-partitioned target (a
        backfill): those periods' upstream rows in full, replacing exactly those partitions; the
        consumed marks of the fork are carried on unchanged (the periods outside were not brought up
        to date)."""
        from pyspark.sql import functions as F

        tp = self.ctx.target.time_partition
        g = tp.granularity
        days = periods.periods(g, start, end)
        window = f"{periods.key(g, start)}..{periods.key(g, end)}"
        fork = self._fork()
        marks = (consumed_marks(self.ctx.platform.pyiceberg_catalog().load_table(self.ident).metadata, fork)
                 if fork is not None else {})
        props = {**self._props(), MODE_PROPERTY: WINDOW, "lakehouse.partition_window": window,
                 **{CONSUMED_PREFIX + k: str(v) for k, v in marks.items()}}
        what = f"{g}s {window} ({len(days)}) of {self.ident} recomputed from {self.upstream} at snapshot {self.end}"
        self.ctx.audit("partition_window", outcome="rewrite", message=what,
                       details={"start": periods.key(g, start), "end": periods.key(g, end), "granularity": g,
                                "upstream": self.upstream, "end_snapshot": self.end})
        self.ctx.report["partition_window"] = window
        # the reader first: it starts Spark, which F.expr needs (a run worker has none before it)
        reader = self._reader(**({"snapshot_id": self.end} if self.end is not None else {}))
        cat = self.ctx.platform.settings.catalog_name
        if g == "day":  # days of a date/timestamp column: also read as its ranges, which Iceberg prunes by
            rows = partition_rows(reader.load(f"{cat}.{self.upstream}"), tp.upstream, tp.column, days)
        else:
            expr = F.expr(tp.upstream) if tp.upstream else F.col(tp.column)
            rows = reader.load(f"{cat}.{self.upstream}").where(_in(expr, days))
        # Iceberg refuses an overwrite-by-filter whose new files hold rows outside the filter: a wrong
        # `upstream` expression fails the write instead of touching other periods
        yield Batch(self.run_sql(self.ctx, self.plan, {self.upstream: rows}), props, label=f"{g}s {window}",
                    write=WriteSpec("overwrite", condition=_in(F.col(tp.column), days)))

    def _report(self, d: Decision, touched: list) -> None:
        """Audit log and run metadata: how this run read its upstream, and why when in full."""
        details: dict[str, Any] = {"mode": d.mode, "upstream": d.upstream, "consumed": d.consumed, "end": d.end}
        if touched:
            details["partitions"] = [str(v) for v in touched[:100]]
        if d.rewrites:
            details["rewrites_skipped"] = list(d.rewrites)
        if self.others:
            details["read_in_full"] = dict(self.others)
        outcome = {FULL: "fallback_full", NOTHING: "nothing_new"}.get(d.mode, "incremental")
        self.ctx.audit("incremental", outcome=outcome, message=d.describe(), details=details)
        self.ctx.report["incremental"] = d.describe()
        if touched:
            self.ctx.report["incremental_partitions"] = len(touched)
        (self.ctx.log.warning if d.mode == FULL else self.ctx.log.info)("%s: %s", self.ident, d.describe())
