"""Runs one stage: extract (plan the input) → write to an audit branch → validate → publish.

This is the platform's orchestrator; the Dagster assets in `lakehouse_assets` are a thin shell
around `StageRunner.extract` (the op in the source's pool) and `StageRunner.load` (the op in
the target's pool). Operational metadata (flags, rules, retry and healing) is read from the
control database on every call, so a metadata update applies to the next step without a redeploy.

It sits above every feature it calls: what is read goes through the source adapter of its kind
(lakehouse.sources), the shared types and the step's state are `lakehouse.core`, and features
receive the step as a `StageContext` (this class is one), never import this module.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator

from lakehouse import alerts, coordination
from lakehouse.branches import drop_branch_and_commits, keep_failed_audit, tidy_before_write
from lakehouse.control import faults
from lakehouse.control.deadline import guard_step
from lakehouse.control.flags import dataset_gate
from lakehouse.control.healing import run_with_healing
from lakehouse.core import (
    SKIPPED,
    AuditFailed,
    Batch,
    DatasetDisabled,
    ExtractPlan,
    StageContext,
    StageDisabled,
    StageOutcome,
)
from lakehouse.export.warehouse import export_after_publish
from lakehouse.iceberg import IcebergTables, branch_name_for_run
from lakehouse.lineage.datahub import emit_stage_run
from lakehouse.lineage.recovery import Reroute, extract_with_recovery, reroute
from lakehouse.platform import Platform
from lakehouse.publish import Superseded, remainder_plan
from lakehouse.sources import adapter_for
from lakehouse.throughput.ratelimit import StageThrottle
from lakehouse.validation import history
from lakehouse.validation.quarantine import quarantine_identifier
from lakehouse.validation.rules import CheckOutcome
from lakehouse.validation.wap import AuditedWrite

# the names callers have always imported from here
__all__ = ["AuditFailed", "Batch", "DatasetDisabled", "ExtractPlan", "Platform", "StageDisabled", "StageOutcome",
           "StageRunner"]

log = logging.getLogger(__name__)


class StageRunner(StageContext):
    """One stage of one pipeline in one run: the context its features see, plus the orchestration."""

    def __init__(self, platform: Platform, pipeline_id: str, stage_name: str, run_id: str | None = None,
                 logger: logging.Logger | None = None, run_tags: dict[str, str] | None = None):
        super().__init__(platform, pipeline_id, stage_name, run_id, logger or log, run_tags=run_tags)
        self.adapter_for = adapter_for  # features reach the source adapters through the context
        self.reroute = self._reroute

    def _reroute(self, error: BaseException) -> Reroute:
        """Healing's switch_to_recovery_path: the cheapest available route into the target."""
        return reroute(self.platform, self.stage.target_id, ctx=self, error=error)

    def require_enabled(self, when: str) -> None:
        ok, reason = self.platform.store.enabled(self.stage.pipeline_id, self.stage.stage_name)
        if not ok:
            self.audit("kill_switch", outcome="stopped", message=f"{when}: {reason}")
            exc = StageDisabled(f"{reason}; stopped {when}. Re-enable with "
                                f"`lakehouse pipeline enable {self.stage.pipeline_id}` or "
                                f"`lakehouse stage enable {self.stage.pipeline_id} {self.stage.stage_name}`.")
            alerts.kill_switch_stopped(self, str(exc))
            raise exc
        gate = dataset_gate(self.platform.store, [self.stage.source_id, self.source_override], self.target.target_id)
        if not gate.ok:
            self.audit("kill_switch", outcome="skipped", message=f"{when}: {gate.reason}")
            exc = DatasetDisabled(f"{gate.reason}; {self.target.identifier} (stage {self.stage.pipeline_id}."
                                  f"{self.stage.stage_name}) skipped {when}. Re-enable with `{gate.enable_command}`.")
            alerts.kill_switch_stopped(self, str(exc))
            raise exc

    # ------------------------------------------------------------------ extract
    def extract(self) -> ExtractPlan:
        try:
            self.require_enabled("before extract")
        except DatasetDisabled as exc:  # a source/target switched off: nothing to read, the load skips too
            return ExtractPlan(self.stage.pipeline_id, self.stage.stage_name, kind=SKIPPED,
                               source_id=self.stage.source_id, skipped_reason=str(exc))
        coordination.hold_lease(self.platform, self.run_id, self.target.identifier)  # claims live with it
        try:
            plan = self._extract()
        except BaseException:
            coordination.release_lease(self.platform, self.run_id, self.target.identifier)
            raise
        coordination.end_step(self.platform, self.run_id, self.target.identifier)
        return plan

    def _extract(self) -> ExtractPlan:
        # probes the default upstream and reroutes over the lineage graph when it is down;
        # any other matched error is healed (healing_actions) and the extract retried in this step
        def attempt() -> ExtractPlan:
            faults.inject("extract", self, source_id=self.source_override or self.stage.source_id)
            return guard_step(self, "extract", lambda: extract_with_recovery(self, self._plan_extract))

        plan = run_with_healing(self, "extract", attempt)
        if self.healing.events:
            plan.details.update({f"extract_{k}": v for k, v in self.healing.summary().items()})
        return plan

    def _plan_extract(self) -> ExtractPlan:
        src = self.source
        kind = self.source_kind
        adapter = adapter_for(kind)
        plan = ExtractPlan(self.stage.pipeline_id, self.stage.stage_name, kind=kind,
                           source_id=src.source_id if src else None)
        if adapter.plans_against_main:
            tables = self.platform.tables()  # read before anything is planned: later commits get checked
            plan.main_at_plan = tables.snapshot_id(self.target.identifier) if tables.exists(self.target.identifier) else None
        adapter.plan(self, src, plan)
        return plan

    # ------------------------------------------------------------------ load
    def input_batches(self, plan: ExtractPlan) -> Iterator[Batch]:
        return adapter_for(plan.kind).batches(self, plan)

    def load(self, plan: ExtractPlan) -> StageOutcome:
        """Write every batch to the run's audit branch, validate it, then publish to main.

        Runs under self-healing (lakehouse.control.healing): a matched error is resolved and the
        load restarts from a fresh audit branch in the same step; the trail lands in audit_log and
        in the materialization metadata.
        """
        try:
            if plan.kind == SKIPPED:  # the extract skipped it (source/target off): re-check before any I/O
                self.require_enabled("before load")
            # the Spark work of each attempt is cancelled past the step's timeout (never a hung run)
            outcome = run_with_healing(self, "load", lambda: guard_step(self, "load", lambda: self._load(plan)))
        except DatasetDisabled as exc:  # switched off in flight: nothing reaches main, the step is skipped
            return self._skip_disabled(str(exc))
        finally:  # claims and the lease end with the step, whatever happened
            coordination.release_lease(self.platform, self.run_id, self.target.identifier)
        outcome.extra.update({k: v for k, v in plan.details.items() if k.startswith("extract_heal")})
        if self.healing.events or self.healing.total_attempts:
            outcome.extra.update(self.healing.summary())
        return outcome

    def _load(self, plan: ExtractPlan) -> StageOutcome:
        t0 = time.monotonic()
        tables = self.platform.tables()
        branch = branch_name_for_run(self.run_id)
        outcome = StageOutcome(self.stage.pipeline_id, self.stage.stage_name, self.target, False, branch)
        self.require_enabled("before load")
        outcome.extra.update(self.tidy_branches(tables))
        if tables.exists(self.target.identifier) and branch in tables.refs(self.target.identifier):
            # a retry of this step (healing or a Dagster retry): start over, never append twice
            tables.drop_branch(self.target.identifier, branch)
        if plan.source_id and self.stage.source_id and plan.source_id != self.stage.source_id:
            self.source_override = plan.source_id  # the extract rerouted: read what it planned
        if plan.skipped_reason:
            outcome.skipped_reason = plan.skipped_reason
            outcome.published = True
            outcome.snapshot_id = tables.snapshot_id(self.target.identifier) if tables.exists(self.target.identifier) else None
            outcome.duration_s = time.monotonic() - t0
            return outcome
        self.audit("stage_started", details={"plan": plan.details, "kind": plan.kind})
        plan = self._write_exactly_once(plan, outcome, t0)
        if plan is not None:
            self._after_publish(plan, outcome)
        return outcome

    def tidy_branches(self, tables: IcebergTables) -> dict:
        """Branches of dead runs and expired failed audits go before this run writes (lakehouse.branches)."""
        coordination.hold_lease(self.platform, self.run_id, self.target.identifier)
        return tidy_before_write(self.platform, tables, self.catalog, self.target.identifier, self.run_id,
                                 (quarantine_identifier(self.target.identifier),), self.target)

    def _write_exactly_once(self, plan: ExtractPlan, outcome: StageOutcome, t0: float,
                            max_rewrites: int = 8) -> ExtractPlan | None:
        """write-audit-publish; when the publish finds part of the input already on main (another
        run), write the remainder again on a fresh branch, or publish nothing. The plan published."""
        for _ in range(max_rewrites):
            try:
                self.write_audit_publish(self.input_batches(plan), outcome=outcome, started=t0,
                                         since=plan.main_at_plan)
                return None if outcome.skipped_reason else plan
            except Superseded as sup:
                self._drop_own_branches()
                overlap = sup.result.overlap
                if overlap is not None:
                    self.audit("already_loaded", outcome="skipped", message=overlap.message(), details=overlap.details())
                    self.log.warning("%s: %s; publishing only the rest", self.target.identifier, overlap.message())
                    outcome.extra["already_loaded"] = "; ".join(
                        x for x in (outcome.extra.get("already_loaded"), overlap.message()) if x)
                    outcome.extra["files_already_loaded"] = (outcome.extra.get("files_already_loaded", 0)
                                                             + overlap.file_count)
                staged = plan.staged_path
                plan = remainder_plan(plan, sup.result, adapter_for(plan.kind).remainder)
                outcome.writes, outcome.rows_written, outcome.quarantined_rows = [], 0, 0
                if plan is None:
                    if staged:  # the downloaded / staged input is on main already, by another run
                        shutil.rmtree(staged, ignore_errors=True)
                    outcome.skipped_reason = outcome.extra["already_loaded"]
                    outcome.published = True
                    tables = self.platform.tables()
                    outcome.snapshot_id = tables.snapshot_id(self.target.identifier)
                    outcome.duration_s = time.monotonic() - t0
                    return None
        raise RuntimeError(f"{self.target.identifier}: gave up after {max_rewrites} rewrites; other runs kept "
                           "publishing the same input (nothing of this run was published)")

    def _drop_own_branches(self) -> None:
        tables = self.platform.tables()
        branch = branch_name_for_run(self.run_id)
        for ident in (self.target.identifier, quarantine_identifier(self.target.identifier)):
            if tables.exists(ident) and branch in tables.refs(ident):
                drop_branch_and_commits(tables, ident, branch)

    def _skip_disabled(self, reason: str) -> StageOutcome:
        """A source/target flag stopped this load: drop what this run put on its audit branches
        (the data is fine, it was just not allowed in) and report the step as skipped. Metadata
        reads go through PyIceberg, so a load skipped before writing never starts Spark."""

        branch = branch_name_for_run(self.run_id)
        cat = self.platform.pyiceberg_catalog()
        snap = None
        for ident in (self.target.identifier, quarantine_identifier(self.target.identifier)):
            if not cat.table_exists(ident):
                continue
            meta = cat.load_table(ident).metadata
            if branch in meta.refs:
                self.platform.tables().drop_branch(ident, branch)
            if ident == self.target.identifier and "main" in meta.refs:
                snap = meta.refs["main"].snapshot_id
        self.log.warning("%s", reason)
        return StageOutcome(self.stage.pipeline_id, self.stage.stage_name, self.target, False, branch,
                            snapshot_id=snap, skipped_reason=reason)

    def write_audit_publish(self, batches, *, outcome: StageOutcome | None = None, started: float | None = None,
                            quarantine: bool = True, since: int | None | str = "now") -> StageOutcome:
        """Batches → audit branch → rules on the branch → kill switch → publish (see lakehouse.validation.wap).

        A failed blocking rule raises AuditFailed: main untouched, branch kept for inspection.
        `since`: the main snapshot the input was planned on (None: the table did not exist), so
        the publish can tell what other runs committed meanwhile; "now" when there was no plan.
        Raises lakehouse.publish.Superseded when some of the input is already on main.
        """
        t0 = started if started is not None else time.monotonic()
        tables = self.platform.tables()
        branch = branch_name_for_run(self.run_id)
        if outcome is None:
            outcome = StageOutcome(self.stage.pipeline_id, self.stage.stage_name, self.target, False, branch)
        coordination.hold_lease(self.platform, self.run_id, self.target.identifier)
        session = AuditedWrite(self, tables, branch, quarantine=quarantine, since=since)
        # records_per_minute / bytes_per_hour of the source and the target, shared by all processes
        src = self.source
        throttle = StageThrottle.for_stage(self.platform.store, self.catalog, src.source_id if src else None,
                                           self.target.target_id)
        for i, batch in enumerate(batches):
            throttle.before_batch()
            self.current_batch = batch  # what evolve_schema / quarantine_input / shrink_batch look at
            faults.inject("batch", self, df=batch.df)  # no-op unless LAKEHOUSE_FAULTS is set
            res = session.write(batch)
            outcome.writes.append(res)
            outcome.rows_written += res.rows_written
            self.log.info("%s: commit %d (%s) wrote %d rows (%d so far) to branch %s",
                          self.target.identifier, i + 1, batch.label, res.rows_written, outcome.rows_written, branch)
            written = int(res.summary.get("added-files-size", 0) or 0)
            throttle.after_batch(res.rows_written, sum(f.size for f in batch.files) or written, written)
        if throttle.active:  # how long rate limits held this stage back (materialization metadata)
            outcome.extra["throttle_wait_s"] = round(throttle.waited_s, 3)
        outcome.quarantined_rows = session.quarantined_rows
        if not session.created:
            outcome.skipped_reason = "no readable input"
            outcome.published = True
            outcome.duration_s = time.monotonic() - t0
            return outcome
        outcome.checks = session.audit()
        self._record_checks(outcome.checks)
        failures = [c for c in outcome.checks if c.blocking_failure]
        if failures:
            names = ", ".join(c.rule.name for c in failures)
            self.audit("audit_failed", outcome="not_published", message=names, details={"branch": branch})
            keep_failed_audit(self.platform, session.branch_tables(), branch, self.run_id, f"failed rule(s) {names}")
            outcome.duration_s = time.monotonic() - t0
            emit_stage_run(self, None, outcome, success=False)  # the failed run and its assertions
            why = "; ".join(f"{c.rule.name}: {c.message}" for c in failures if c.message)
            failed = AuditFailed(
                f"{self.target.identifier} (stage {self.stage.pipeline_id}.{self.stage.stage_name}) failed "
                f"blocking rule(s) {names}" + (f" ({why})" if why else "") + ": main is unchanged, "
                f"the data is kept on branch {branch!r}. "
                f"Inspect it with `lakehouse branches show {self.target.identifier} {branch}`, fix the input "
                "or the rule, then re-run the stage.",
                outcome.checks, branch,
            )
            alerts.audit_failed(self, failed)  # never raises: an alert channel that is down fails nothing
            raise failed

        def publish() -> int | None:
            self.require_enabled("before publish")  # re-checked on every healing retry too
            faults.inject("publish", self)
            return session.publish()

        # a commit conflict here is healed by refreshing and publishing again (not rewriting)
        result = run_with_healing(self, "publish", publish)
        if not result.published:
            raise Superseded(result)  # the caller writes what is left on a fresh branch
        outcome.snapshot_id = result.snapshot_id
        outcome.published = True
        outcome.duration_s = time.monotonic() - t0
        self.audit("published", outcome="success", duration_ms=int(outcome.duration_s * 1000),
                   details={"snapshot_id": outcome.snapshot_id, "rows": outcome.rows_written,
                            "quarantined_rows": outcome.quarantined_rows})
        return outcome

    def _record_checks(self, checks: list[CheckOutcome]) -> None:
        history.record_outcomes(self, checks)  # looked up per call: tests hook the audit moment here

    def _after_publish(self, plan: ExtractPlan, outcome: StageOutcome) -> None:
        adapter_for(plan.kind).after_publish(self, plan, outcome)  # checkpoints, cursors, staged copies
        if self.target.export_target_id:
            export_after_publish(self, outcome)  # adds rows/table/duration to outcome.extra
        emit_stage_run(self, plan, outcome, success=True)  # lineage + run to DataHub; never raises
