"""What both engines' write sessions share: one run's audit branch of a target and of its quarantine
table, the counts the rules' outcomes need, and the exactly-once publish.

`BranchWrite` is the engine-neutral half of a write session (`Engine.session`): the branch
bookkeeping (the table and this run's branch started before the first write, the fork snapshot,
the row counts before and after), the acting rules' counts, and the publish of both branches
under the target's publish lock. Each engine subclasses it with what touches data: `write(batch)`
(conform, tag and split by the acting rules, quarantine, branch write) and `audit()` (the rules on
the rows this run added): `lakehouse.engines.spark.write.SparkAuditedWrite` on Spark DataFrames,
`lakehouse.engines.arrow.write.ArrowAuditedWrite` on Arrow tables. `QuarantineBranch` is the same
split for the quarantine table's branch.

Everything here speaks PyIceberg metadata through the tables handle (`lakehouse.table.iceberg`), never a
frame: no Spark or Arrow import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakehouse.ingest.files import CHECKPOINT_PROPERTY
from lakehouse.table.iceberg import MAIN, CatalogTables, WriteResult, retry_metadata_commit
from lakehouse.validation.quarantine import quarantine_target
from lakehouse.validation.rules import ActionCounts, CheckOutcome, SchemaDrift, acting_rules

if TYPE_CHECKING:
    from lakehouse.stage.core import Batch, StageContext


class QuarantineBranch:
    """Appends a run's quarantined rows to the audit branch of the quarantine table, and publishes
    it after the data. An engine adds `write` (the quarantine columns on its frame) and `align`."""

    def __init__(self, runner: StageContext, tables: CatalogTables, branch: str):
        self.runner = runner
        self.tables = tables
        self.branch = branch
        self.target = quarantine_target(runner.target)
        self.ident = self.target.identifier
        self.created = False
        self.fork: int | None = None

    def write(self, bad: Any, batch_properties: dict[str, str] | None = None) -> int:
        """The rows failing a quarantine rule (input columns + `_failed_rules`) with `_run_id`,
        `_quarantined_at` and `_quarantine_id` added, appended (`append`); returns their count."""
        raise NotImplementedError

    def align(self, rows: Any) -> Any:
        """The rows as the engine's writer takes them against the quarantine table's columns."""
        raise NotImplementedError

    def append(self, rows: Any, schema: Any, batch_properties: dict[str, str] | None = None) -> int:
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
        if self.created:
            publish_quarantine(self.tables, self.ident, self.branch, since=self.fork, run_id=self.runner.run_id)


def publish_quarantine(tables: CatalogTables, ident: str, branch: str, *, since: int | None, run_id: str) -> None:
    """A run's quarantine branch onto the quarantine table's main (after the data's publish)."""
    from lakehouse.table.publish import publish_branch

    res = publish_branch(tables, ident, branch, since=since, run_id=run_id)
    if not res.published:
        raise RuntimeError(f"{ident}: quarantine branch {branch} not published "
                           f"({res.overlap.message() if res.overlap else 'main moved'}); it is kept for "
                           f"inspection (`lakehouse branches list {ident}`)")


class BranchWrite:
    """One run's writes to one target, on its audit branch, until publish (the engine-neutral half;
    see the module docstring). An engine adds `write`, `audit` and `_new_quarantine`."""

    def __init__(self, runner: StageContext, tables: CatalogTables, branch: str, *, quarantine: bool = True,
                 since: int | None | str = "now", prepare_branch: Callable[[CatalogTables, str], None] | None = None):
        self.runner = runner
        self.tables = tables
        self.branch = branch
        self.target = runner.target
        self.ident = self.target.identifier
        self.rules = [r for r in runner.rules if r.enabled]
        self.contracts = [r for r in self.rules if r.type == "schema_contract"]
        self.quarantine_enabled = quarantine
        self.created = False
        self.fork_snapshot: int | None = None
        # main when the run planned (None: no table yet); the publish checks what main committed after it
        self.since = since if since != "now" else (tables.refs_if_exists(self.ident) or {}).get(MAIN)
        self.prepare_branch = prepare_branch  # e.g. entity_raw UPSERT's delete: the write then replaces data
        self.appends_only = prepare_branch is None
        self.previous_rows = self._total_records(MAIN)
        self.actions = ActionCounts() if acting_rules(self.rules) else None
        self.drift: dict[str, SchemaDrift] = {}
        self.quarantined_rows = 0
        self._quarantine: QuarantineBranch | None = None

    # ------------------------------------------------------------------ what an engine implements
    def write(self, batch: Batch) -> WriteResult:
        """One batch onto the branch: conformed to the table, split by the acting rules (failing
        rows counted, quarantined rows to the quarantine branch), the rest written."""
        raise NotImplementedError

    def audit(self) -> list[CheckOutcome]:
        """Every enabled rule's outcome on the rows this run added."""
        raise NotImplementedError

    def _new_quarantine(self) -> QuarantineBranch:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared
    def _quarantine_writer(self) -> QuarantineBranch:
        if self._quarantine is None:
            self._quarantine = self._new_quarantine()
        return self._quarantine

    def _total_records(self, branch: str) -> int | None:
        snap = (self.tables.refs_if_exists(self.ident) or {}).get(branch)  # one metadata load, not two
        if snap is None:
            return None
        return int(self.tables.snapshot_summary(self.ident, snap).get("total-records", 0))

    def _start_branch(self, schema) -> None:
        """The table (created from `schema` if new) and this run's branch, before the first write."""
        props = self._table_properties()

        def start_branch():
            # only Spark's tables take properties (an incremental merge, which runs on Spark only)
            self.tables.ensure_table(self.target, schema, **({"properties": props} if props else {}))
            self.tables.create_branch(self.ident, self.branch)

        retry_metadata_commit(self.tables, self.ident, start_branch)
        self.fork_snapshot = self.tables.snapshot_id(self.ident, self.branch)
        if self.prepare_branch is not None:
            self.prepare_branch(self.tables, self.branch)
        self.created = True

    def _table_properties(self) -> dict[str, str]:
        """What the platform adds to the target's table properties: an incremental merge stage's
        keys get Parquet bloom filters, so finding the rows of a change set's keys skips the row
        groups without them whatever the table's size (lakehouse.stage.pruning)."""
        from lakehouse.stage.pruning import bloom_filter_properties

        inc = getattr(getattr(self.runner, "stage", None), "incremental", None)
        return bloom_filter_properties(inc.merge_keys) if inc is not None and inc.mode == "merge" else {}

    # ------------------------------------------------------------------ identical to main
    def content_fingerprint(self, snapshot_id: int) -> tuple | None:
        """(rows, an order-independent hash of every row) of the target at `snapshot_id`; None when
        this engine does not compute one (then a write is never taken as identical to main)."""
        return None

    def identical_to_main(self) -> bool:
        """Whether the branch holds exactly main's rows (a full recompute that changed nothing): same
        row count and content fingerprint, and nothing quarantined."""
        refs = self.tables.refs_if_exists(self.ident) or {}
        main, head = refs.get(MAIN), refs.get(self.branch)
        if main is None or head is None or self.quarantined_rows or head == main:
            return False
        mine = self.content_fingerprint(head)
        return mine is not None and mine == self.content_fingerprint(main)

    # ------------------------------------------------------------------ publish
    def branch_tables(self) -> list[str]:
        """The tables this run has an audit branch on."""
        return [self.ident] + ([self._quarantine.ident] if self._quarantine is not None and self._quarantine.created
                               else [])

    def publish_args(self) -> dict:
        """What the publish of this branch needs besides the table and the branch (`publish_branches`):
        a staged-write reference stores it (lakehouse.stage.values.StagedWrite), so a publish in
        another process or instance needs no live session."""
        q = self._quarantine
        return {"since": self.since, "run_id": self.runner.run_id,
                "can_rebase": self.target.write_mode == "append" and self.prepare_branch is None,
                "quarantine": (q.ident, q.fork) if q is not None and q.created else None}

    def publish(self):
        """Publish the data branch exactly once (lakehouse.table.publish), then the quarantine branch,
        both under the target's publish lock; each commit drops its branch. Returns the data's
        PublishResult: not published when the input (or part of it) is already on main. A
        crash between the two commits is completed by the next run (lakehouse.table.branches)."""
        return publish_branches(self.runner.platform, self.tables, self.ident, self.branch, **self.publish_args(),
                                ctx=self.runner)


def publish_branches(platform, tables: CatalogTables, ident: str, branch: str, *, since: int | None, run_id: str,
                     can_rebase: bool, quarantine: tuple[str, int | None] | None, ctx=None):
    """`BranchWrite.publish` from its parts: the data branch exactly once, then (when this run
    quarantined rows: `quarantine` = (quarantine table, its main at the fork)) the quarantine
    branch, both under the target's publish lock. `ctx` (the stage's context) names the stage to the
    test hooks' `<point>@<stage>`."""
    from lakehouse.control import faults
    from lakehouse.ingest.jdbc import watermark_order
    from lakehouse.runtime import coordination
    from lakehouse.table.publish import publish_branch

    faults.inject("before_publish", ctx)
    with coordination.publish_lock(platform, ident):
        res = publish_branch(tables, ident, branch, since=since, run_id=run_id, watermark_order=watermark_order,
                             can_rebase=can_rebase)
        if res.published and quarantine is not None:
            faults.inject("between_publishes", ctx)
            qident, fork = quarantine
            publish_quarantine(tables, qident, branch, since=fork, run_id=run_id)
    return res
