"""The one write-audit-publish service: every write into an Iceberg table of the platform goes here.

Stage loads (`lakehouse.stage.runner`, reached from the Dagster IO manager), entity_raw loads
(`lakehouse.stage.entity_raw`) and quarantine replays all hand their input to `WriteAuditPublish` as a
stream of `Batch`es. For each of them the same guarantees hold, in this order:

1. each batch is one commit on the run's audit branch `audit_<run_id>` (its file checkpoints ride
   in the snapshot summary), after the source/target throttles; rows failing a quarantine rule go
   to the quarantine table's branch (the engine's write session, a `lakehouse.engines.audited.BranchWrite`, does the writing);
2. the rules run on the branch; a failed blocking rule keeps the branch and raises `AuditFailed`
   (steps 1–2 are `write_and_audit`, 3–4 `publish`: a caller may report the rules in between, as
   the Dagster load op does before its output reaches the IO manager that publishes it);
3. the kill switch is read again, immediately before the publish (under self-healing, so a commit
   conflict is refreshed and published again, never rewritten);
4. the publish is exactly once (`lakehouse.table.publish`): input another run already put on main is
   cut off and only the rest is written again (`write_exactly_once`), or nothing is published.

The engine (lakehouse.engines.choice: Spark, or PyIceberg + Arrow without a JVM) supplies the tables
handle and the write/audit session; everything above stays the same for both.

It knows the step only as a `StageContext` (the run, stage, source, target, rules and audit sink),
so it sits below the orchestrators that build that context and above the features it drives.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse.control import faults
from lakehouse.control.attempt import attempt
from lakehouse.control.flags import dataset_gate, enable_command
from lakehouse.engines import isolate
from lakehouse.engines.spark import SparkEngine
from lakehouse.ops import alerts
from lakehouse.runtime import coordination
from lakehouse.stage.core import (
    PYTHON,
    SQL,
    AuditFailed,
    Batch,
    DatasetDisabled,
    ExtractPlan,
    StageContext,
    StageDisabled,
    StageOutcome,
)
from lakehouse.table.branches import drop_branch_and_commits, keep_failed_audit, tidy_before_write
from lakehouse.table.iceberg import MAIN, CatalogTables, branch_name_for_run
from lakehouse.table.publish import Superseded, remainder_plan
from lakehouse.throughput.ratelimit import StageThrottle
from lakehouse.validation import history
from lakehouse.validation.quarantine import quarantine_identifier
from lakehouse.validation.rules import CheckOutcome

if TYPE_CHECKING:
    from lakehouse.engines.audited import BranchWrite

#: how often one load writes the remainder again when other runs keep publishing the same input
MAX_REWRITES = 8


@dataclass
class Audited:
    """A write that passed its audit and awaits `WriteAuditPublish.publish`: its branch session
    (None: nothing was written, the outcome says why) and the outcome so far."""

    session: BranchWrite | None
    outcome: StageOutcome
    started: float


def require_enabled(ctx: StageContext, when: str) -> None:
    """The kill switch: pipeline/stage flags (StageDisabled) and source/target flags (DatasetDisabled)
    stop the step; the runner skips it with the reason (a kill switch is not a failure). Read from
    the control DB at every call, so a flip applies in flight."""
    store = ctx.platform.store
    if ctx.described_by_metadata:
        ok, reason = store.enabled(ctx.stage.pipeline_id, ctx.stage.stage_name)
    else:  # no pipeline row (an entity_raw load): the platform flag, then its datasets' flags below
        ok, reason = store.flag("platform", "*") is not False, "the whole platform is disabled (control_flags platform/*)"
    if not ok:
        ctx.audit("kill_switch", outcome="stopped", message=f"{when}: {reason}")
        exc = StageDisabled(f"{reason}; stopped {when}. Re-enable with "
                            f"`{enable_command(reason, ctx.stage.pipeline_id, ctx.stage.stage_name)}`.")
        alerts.kill_switch_stopped(ctx, str(exc))
        raise exc
    gate = dataset_gate(store, [ctx.stage.source_id, ctx.source_override], ctx.target.target_id)
    if not gate.ok:
        ctx.audit("kill_switch", outcome="skipped", message=f"{when}: {gate.reason}")
        exc = DatasetDisabled(f"{gate.reason}; {ctx.target.identifier} (stage {ctx.stage.pipeline_id}."
                              f"{ctx.stage.stage_name}) skipped {when}. Re-enable with `{gate.enable_command}`.")
        alerts.kill_switch_stopped(ctx, str(exc))
        raise exc


class WriteAuditPublish:
    """Write-audit-publish of one step into its target (see the module docstring).

    `quarantine`: rows failing a quarantine rule go to the quarantine table (off for a replay of
    that table). `prepare_branch(tables, branch)`: runs once the audit branch exists, before the
    first batch (entity_raw's UPSERT deletes the rows it replaces there); a write that prepares
    its branch replaces data, so its publish never rebases. `engine`: what writes and audits
    (lakehouse.engines.spark.SparkEngine by default, or lakehouse.engines.arrow.ArrowEngine).
    """

    def __init__(self, ctx: StageContext, *, quarantine: bool = True,
                 prepare_branch: Callable[[CatalogTables, str], None] | None = None, engine=None):
        self.ctx = ctx
        self.quarantine = quarantine
        self.prepare_branch = prepare_branch
        self.branch = branch_name_for_run(ctx.run_id)
        self.engine = engine if engine is not None else SparkEngine()

    # ------------------------------------------------------------------ branches
    def tidy_branches(self, tables: CatalogTables) -> dict:
        """Branches of dead runs and expired failed audits go before this run writes (lakehouse.table.branches)."""
        ctx = self.ctx
        coordination.hold_lease(ctx.platform, ctx.run_id, ctx.target.identifier)
        return tidy_before_write(ctx.platform, tables, ctx.catalog, ctx.target.identifier, ctx.run_id,
                                 (quarantine_identifier(ctx.target.identifier),), ctx.target)

    def drop_own_branches(self) -> None:
        """This run's audit branches of the target and its quarantine table, with their commits."""
        tables = self.engine.tables(self.ctx.platform)
        for ident in (self.ctx.target.identifier, quarantine_identifier(self.ctx.target.identifier)):
            if self.branch in (tables.refs_if_exists(ident) or {}):
                drop_branch_and_commits(tables, ident, self.branch)

    def skip_disabled(self, reason: str) -> StageOutcome:
        """A source/target flag stopped this write: drop what this run put on its audit branches
        (the data is fine, it was just not allowed in) and report the step as skipped. Metadata
        reads go through PyIceberg, so a write skipped before writing never starts Spark."""
        ctx = self.ctx
        cat = ctx.platform.pyiceberg_catalog()
        snap = None
        for ident in (ctx.target.identifier, quarantine_identifier(ctx.target.identifier)):
            if not cat.table_exists(ident):
                continue
            meta = cat.load_table(ident).metadata
            if self.branch in meta.refs:  # by the engine's tables: an Arrow write skipped here starts no JVM
                self.engine.tables(ctx.platform).drop_branch(ident, self.branch)
            if ident == ctx.target.identifier and "main" in meta.refs:
                snap = meta.refs["main"].snapshot_id
        ctx.log.warning("%s", reason)
        return StageOutcome(ctx.stage.pipeline_id, ctx.stage.stage_name, ctx.target, False, self.branch,
                            snapshot_id=snap, skipped_reason=reason)

    # ------------------------------------------------------------------ exactly once
    def write_exactly_once(self, plan: ExtractPlan, batches_for: Callable[[ExtractPlan], Iterable[Batch]],
                           outcome: StageOutcome, started: float, audited: Audited | None = None) -> ExtractPlan | None:
        """`run` over the plan's batches (`audited`: they are written and audited already); when the
        publish finds part of the input already on main (another run), write the remainder (the
        adapter's `remainder`) again on a fresh branch, audit and publish it, or publish nothing.
        Returns the plan that was published (None: nothing of it was)."""
        ctx = self.ctx
        for _ in range(MAX_REWRITES):
            try:
                if audited is None:
                    audited = self.write_and_audit(batches_for(plan), outcome=outcome, started=started,
                                                   since=plan.main_at_plan)
                self.publish(audited)
                return None if outcome.skipped_reason else plan
            except Superseded as sup:
                audited = None
                self.drop_own_branches()
                overlap = sup.result.overlap
                if overlap is not None:
                    ctx.audit("already_loaded", outcome="skipped", message=overlap.message(), details=overlap.details())
                    ctx.log.warning("%s: %s; publishing only the rest", ctx.target.identifier, overlap.message())
                    outcome.extra["already_loaded"] = "; ".join(
                        x for x in (outcome.extra.get("already_loaded"), overlap.message()) if x)
                    outcome.extra["files_already_loaded"] = (outcome.extra.get("files_already_loaded", 0)
                                                             + overlap.file_count)
                staged = plan.staged_path
                plan = remainder_plan(plan, sup.result, ctx.adapter_for(plan.kind).remainder)
                outcome.reset_counts()
                if plan is None:
                    if staged:  # the downloaded / staged input is on main already, by another run
                        shutil.rmtree(staged, ignore_errors=True)
                    outcome.skipped_reason = outcome.extra["already_loaded"]
                    outcome.published = True
                    outcome.snapshot_id = ctx.platform.tables().snapshot_id(ctx.target.identifier)
                    outcome.duration_s = time.monotonic() - started
                    return None
        raise RuntimeError(f"{ctx.target.identifier}: gave up after {MAX_REWRITES} rewrites; other runs kept "
                           "publishing the same input (nothing of this run was published)")

    # ------------------------------------------------------------------ write, audit, publish
    def run(self, batches: Iterable[Batch], *, outcome: StageOutcome | None = None, started: float | None = None,
            since: int | None | str = "now") -> StageOutcome:
        """Batches → audit branch → rules on the branch → kill switch → publish.

        A failed blocking rule raises AuditFailed: main untouched, branch kept for inspection.
        `since`: the main snapshot the input was planned on (None: the table did not exist), so
        the publish can tell what other runs committed meanwhile; "now" when there was no plan.
        Raises lakehouse.table.publish.Superseded when some of the input is already on main.
        """
        return self.publish(self.write_and_audit(batches, outcome=outcome, started=started, since=since))

    def write_and_audit(self, batches: Iterable[Batch], *, outcome: StageOutcome | None = None,
                        started: float | None = None, since: int | None | str = "now") -> Audited:
        """Batches → audit branch → rules on the branch (`outcome.checks`); nothing reaches main.
        A failed blocking rule raises AuditFailed (branch kept); see `run` for `since`."""
        ctx = self.ctx
        t0 = started if started is not None else time.monotonic()
        tables = self.engine.tables(ctx.platform)
        branch = self.branch
        if outcome is None:
            outcome = StageOutcome(ctx.stage.pipeline_id, ctx.stage.stage_name, ctx.target, False, branch)
        coordination.hold_lease(ctx.platform, ctx.run_id, ctx.target.identifier)
        session = self.engine.session(ctx, tables, branch, quarantine=self.quarantine, since=since,
                                      prepare_branch=self.prepare_branch)
        # records_per_minute / bytes_per_hour of the source and the target, shared by all processes
        src = ctx.source
        throttle = StageThrottle.for_stage(ctx.platform.store, ctx.catalog, src.source_id if src else None,
                                           ctx.target.target_id)
        for i, batch in enumerate(batches):
            throttle.before_batch()
            ctx.current_batch = batch  # what evolve_schema / quarantine_input / shrink_batch look at
            faults.inject("batch", ctx, df=batch.df)  # no-op unless LAKEHOUSE_FAULTS is set
            # a read that fails on some of the batch's files writes the batch without them (Spark reads
            # as it writes; lakehouse.engines.isolate finds the files, quarantines or defers them)
            written = isolate.write_isolating(ctx, batch, session.write)
            if written is None:  # no file of the batch could be read: nothing to write
                continue
            res, batch = written
            ctx.current_batch = batch
            outcome.add_write(res)
            counts = res.logical()
            ctx.log.info("%s: commit %d (%s) inserted %d, updated %d, deleted %d rows (%d written so far; the "
                         "data files it wrote hold %d rows) on branch %s", ctx.target.identifier, i + 1, batch.label,
                         counts["rows_inserted"], counts["rows_updated"], counts["rows_deleted"],
                         outcome.rows_written, res.rows_written, branch)
            written = int(res.summary.get("added-files-size", 0) or 0)
            throttle.after_batch(res.rows_written, sum(f.size for f in batch.files) or written, written)
        if throttle.active:  # how long rate limits held this stage back (materialization metadata)
            outcome.extra["throttle_wait_s"] = round(throttle.waited_s, 3)
        outcome.quarantined_rows = session.quarantined_rows
        if not session.created:
            quarantined = ctx.report.get("quarantined_files") or []
            outcome.skipped_reason = "no readable input" + (
                f": {len(quarantined)} file(s) quarantined ({', '.join(q['key'] for q in quarantined[:5])}"
                f"{', …' if len(quarantined) > 5 else ''}; reasons in the audit log, event file_quarantined)"
                if quarantined else "")
            outcome.published = True
            outcome.duration_s = time.monotonic() - t0
            return Audited(None, outcome, t0)
        outcome.checks = session.audit()
        self.record_checks(outcome.checks)
        failures = [c for c in outcome.checks if c.blocking_failure]
        if failures:
            raise self._audit_failed(session, outcome, failures, t0)
        if self._recomputes(ctx) and session.identical_to_main():  # a full recompute that changed nothing
            main = (tables.refs_if_exists(ctx.target.identifier) or {}).get(MAIN)
            self.drop_own_branches()
            outcome.skipped_reason = (f"identical to main (snapshot {main}): the recomputed {outcome.rows_written} "
                                      "row(s) have main's content fingerprint; nothing published")
            outcome.published, outcome.snapshot_id = True, main
            outcome.duration_s = time.monotonic() - t0
            ctx.audit("identical_to_main", outcome="skipped", message=outcome.skipped_reason)
            ctx.log.info("%s: %s", ctx.target.identifier, outcome.skipped_reason)
            return Audited(None, outcome, t0)
        return Audited(session, outcome, t0)

    def _recomputes(self, ctx: StageContext) -> bool:
        """A full recompute from lake tables (an overwrite SQL or Python stage, not incremental): its
        result may equal main, and publishing nothing then loses no bookkeeping (no file checkpoints,
        no consumed-snapshot marks ride on its commit)."""
        return (ctx.described_by_metadata and self.quarantine and self.prepare_branch is None
                and ctx.target.write_mode == "overwrite"
                and getattr(ctx.stage, "incremental", None) is None and ctx.source_kind in (SQL, PYTHON))

    def publish(self, audited: Audited) -> StageOutcome:
        """Kill switch → exactly-once publish of an audited write (Superseded: part of its input is
        on main already)."""
        ctx, session, outcome, t0 = self.ctx, audited.session, audited.outcome, audited.started
        if session is None:
            return outcome

        def publish():
            require_enabled(ctx, "before publish")  # re-checked on every healing retry too
            faults.inject("publish", ctx)
            return session.publish()

        # a commit conflict here is healed by refreshing and publishing again (not rewriting); the
        # load step's deadline and retry policy are the ones around this (lakehouse.stage.steps)
        result = attempt(ctx, "publish", publish, deadline=False)
        if not result.published:
            raise Superseded(result)  # the caller writes what is left on a fresh branch
        outcome.snapshot_id = result.snapshot_id
        outcome.published = True
        outcome.duration_s = time.monotonic() - t0
        ctx.audit("published", outcome="success", duration_ms=int(outcome.duration_s * 1000),
                  details={"snapshot_id": outcome.snapshot_id, "rows": outcome.rows_written,
                           "rows_inserted": outcome.rows_inserted, "rows_updated": outcome.rows_updated,
                           "rows_deleted": outcome.rows_deleted, "rows_rewritten": outcome.rows_rewritten,
                           "quarantined_rows": outcome.quarantined_rows})
        return outcome

    def record_checks(self, checks: list[CheckOutcome]) -> None:
        history.record_outcomes(self.ctx, checks)  # looked up per call: tests hook the audit moment here

    def _audit_failed(self, session, outcome: StageOutcome, failures: list[CheckOutcome],
                      t0: float) -> AuditFailed:
        ctx, branch = self.ctx, self.branch
        names = ", ".join(c.rule.name for c in failures)
        ctx.audit("audit_failed", outcome="not_published", message=names, details={"branch": branch})
        keep_failed_audit(ctx.platform, session.branch_tables(), branch, ctx.run_id, f"failed rule(s) {names}")
        outcome.duration_s = time.monotonic() - t0
        from lakehouse.lineage.datahub import emit_stage_run  # acryl-datahub: imported by runs, not by every code load

        emit_stage_run(ctx, None, outcome, success=False)  # the failed run and its assertions
        why = "; ".join(f"{c.rule.name}: {c.message}" for c in failures if c.message)
        failed = AuditFailed(
            f"{ctx.target.identifier} (stage {ctx.stage.pipeline_id}.{ctx.stage.stage_name}) failed "
            f"blocking rule(s) {names}" + (f" ({why})" if why else "") + ": main is unchanged, "
            f"the data is kept on branch {branch!r}. "
            f"Inspect it with `lakehouse branches show {ctx.target.identifier} {branch}`, fix the input "
            "or the rule, then re-run the stage.",
            outcome.checks, branch,
        )
        alerts.audit_failed(ctx, failed)  # never raises: an alert channel that is down fails nothing
        return failed
