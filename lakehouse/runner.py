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
import time
from dataclasses import dataclass, field
from typing import Any

from lakehouse import coordination
from lakehouse.control import faults
from lakehouse.control.deadline import guard_step
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
from lakehouse.engines import choice as engine_choice
from lakehouse.engines import engine_for
from lakehouse.engines.spark import SparkEngine
from lakehouse.export.warehouse import export_after_publish
from lakehouse.iceberg import MAIN, branch_name_for_run
from lakehouse.lineage.background import emit_stage_run
from lakehouse.lineage.recovery import Reroute, extract_with_recovery, reroute
from lakehouse.platform import Platform
from lakehouse.sources import adapter_for
from lakehouse.wap_service import Audited, WriteAuditPublish, require_enabled

# the names callers have always imported from here
__all__ = ["AuditFailed", "Batch", "DatasetDisabled", "ExtractPlan", "Platform", "StageDisabled", "StageOutcome",
           "StageRunner", "StagedLoad"]

log = logging.getLogger(__name__)


@dataclass
class StagedLoad:
    """A stage's load between its audit and its publish (`StageRunner.write_and_audit` → `publish`):
    `audited` None when there is nothing to publish (skipped; `outcome` says why); `engine` the one
    that wrote it (lakehouse.engines.choice), which also writes a remainder."""

    plan: ExtractPlan
    outcome: StageOutcome
    audited: Audited | None = None
    engine: Any = field(default_factory=SparkEngine)

    @property
    def changes_nothing(self) -> bool:
        """Nothing to publish: skipped, nothing new, or a result identical to main (`outcome` says which)."""
        return self.audited is None or self.audited.session is None


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

    # ------------------------------------------------------------------ extract
    def extract(self) -> ExtractPlan:
        try:
            require_enabled(self, "before extract")
        except StageDisabled as exc:  # a kill switch (pipeline, stage, source, target): nothing to read, the load skips too
            return self._skipped_plan(str(exc))
        upstream_off = self._upstream_disabled()
        if upstream_off:  # a disabled stage upstream in the pipeline: this one skips with it
            self.log.warning("%s", upstream_off)
            self.audit("kill_switch", outcome="skipped", message=f"before extract: {upstream_off}")
            return self._skipped_plan(upstream_off)
        coordination.hold_lease(self.platform, self.run_id, self.target.identifier)  # claims live with it
        try:
            plan = self._extract()
        except BaseException:
            coordination.release_lease(self.platform, self.run_id, self.target.identifier)
            raise
        coordination.end_step(self.platform, self.run_id, self.target.identifier)
        return plan

    def _skipped_plan(self, reason: str) -> ExtractPlan:
        return ExtractPlan(self.stage.pipeline_id, self.stage.stage_name, kind=SKIPPED,
                           source_id=self.stage.source_id, skipped_reason=reason)

    def _upstream_disabled(self) -> str | None:
        """Why this stage skips with a disabled stage upstream of it in its pipeline (None: it does not)."""
        from lakehouse.control.flags import upstream_disabled

        def tables_read() -> dict[str, list[str]]:
            from lakehouse.metadata.derived import read_structure

            structure = read_structure(self.platform.store, [self.stage.pipeline_id])
            return {s: list(d.upstream_tables) for (p, s), d in structure.derived.items()
                    if p == self.stage.pipeline_id}

        return upstream_disabled(self.catalog, self.stage.pipeline_id, self.stage.stage_name, tables_read)

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
            plan.main_at_plan = (tables.refs_if_exists(self.target.identifier) or {}).get(MAIN)
        adapter.plan(self, src, plan)
        return plan

    # ------------------------------------------------------------------ load
    def load(self, plan: ExtractPlan) -> StageOutcome:
        """Write every batch to the run's audit branch, validate it, then publish to main."""
        return self.publish(self.write_and_audit(plan))

    def write_and_audit(self, plan: ExtractPlan) -> StagedLoad:
        """The first half of `load`: every batch on the run's audit branch, the rules evaluated there
        (`outcome.checks`); main untouched. A failed blocking rule raises AuditFailed (branch kept).
        The Dagster load op runs this, reports the rules, and yields its output only when they
        passed: the IO manager's `publish` of it is then the asset's materialization.

        Runs under self-healing (lakehouse.control.healing): a matched error is resolved and the
        write restarts from a fresh audit branch in the same step; the trail lands in audit_log and
        in the materialization metadata.
        """
        try:
            if plan.kind == SKIPPED:  # the extract skipped it (a kill switch): skipped here too, without I/O
                require_enabled(self, "before load")  # still off: its own reason
                return StagedLoad(plan, self.wap().skip_disabled(plan.skipped_reason or "skipped"))
            # the Spark work of each attempt is cancelled past the step's timeout (never a hung run)
            return run_with_healing(self, "load", lambda: guard_step(self, "load", lambda: self._stage(plan)))
        except StageDisabled as exc:  # switched off: nothing reaches main, the step is skipped (not a failure)
            return StagedLoad(plan, self.wap().skip_disabled(str(exc)))
        except BaseException:  # the step ends here: its claims and the lease with it
            coordination.release_lease(self.platform, self.run_id, self.target.identifier)
            raise

    def publish(self, staged: StagedLoad) -> StageOutcome:
        """The second half of `load`: the kill switch read again, then the exactly-once publish (and
        the remainder written, audited and published again when another run published part of the
        input meanwhile). A healed error here starts the load over from a fresh audit branch, as one
        healing scope over the whole load always did."""
        pending = [staged]

        def attempt() -> StageOutcome:
            return self._publish(pending.pop() if pending else self._stage(staged.plan))

        try:
            outcome = run_with_healing(self, "load", lambda: guard_step(self, "load", attempt))
        except StageDisabled as exc:  # switched off in flight: nothing reaches main, the step is skipped
            return self.wap().skip_disabled(str(exc))
        finally:  # claims and the lease end with the step, whatever happened
            coordination.release_lease(self.platform, self.run_id, self.target.identifier)
        outcome.extra.update({k: v for k, v in staged.plan.details.items() if k.startswith("extract_heal")})
        if self.healing.events or self.healing.total_attempts:
            outcome.extra.update(self.healing.summary())
        # unreadable files kept out of the table in this run (why: the audit log, event file_quarantined)
        files = {q["key"] for q in self.report.get("quarantined_files") or []} | set(self.healing.quarantined_files)
        if files:
            outcome.extra["files_quarantined"] = len(files)
        return outcome

    def _stage(self, plan: ExtractPlan) -> StagedLoad:
        t0 = time.monotonic()
        choice = engine_choice.choose(self, plan)  # Spark, or PyIceberg + Arrow (no JVM) for small file loads
        engine = engine_for(choice)
        tables = engine.tables(self.platform)
        branch = branch_name_for_run(self.run_id)
        outcome = StageOutcome(self.stage.pipeline_id, self.stage.stage_name, self.target, False, branch)
        outcome.extra.update(choice.metadata())
        require_enabled(self, "before load")
        outcome.extra.update(self.wap().tidy_branches(tables))
        if branch in (tables.refs_if_exists(self.target.identifier) or {}):
            # a retry of this step (healing or a Dagster retry): start over, never append twice
            tables.drop_branch(self.target.identifier, branch)
        if plan.source_id and self.stage.source_id and plan.source_id != self.stage.source_id:
            self.source_override = plan.source_id  # the extract rerouted: read what it planned
        if plan.skipped_reason:
            outcome.skipped_reason = plan.skipped_reason
            outcome.published = True
            outcome.snapshot_id = (tables.refs_if_exists(self.target.identifier) or {}).get(MAIN)
            outcome.duration_s = time.monotonic() - t0
            return StagedLoad(plan, outcome)
        self.audit("stage_started", details={"plan": plan.details, "kind": plan.kind, **choice.metadata()})
        audited = WriteAuditPublish(self, engine=engine).write_and_audit(
            engine.batches(self, plan), outcome=outcome, started=t0, since=plan.main_at_plan)
        return StagedLoad(plan, outcome, audited, engine)

    def _publish(self, staged: StagedLoad) -> StageOutcome:
        if staged.audited is None:  # nothing to publish (skipped)
            return staged.outcome
        engine = staged.engine
        published = WriteAuditPublish(self, engine=engine).write_exactly_once(
            staged.plan, lambda p: engine.batches(self, p), staged.outcome, staged.audited.started,
            audited=staged.audited)
        if published is not None:
            self._after_publish(published, staged.outcome)
        return staged.outcome

    def wap(self, *, quarantine: bool = True) -> WriteAuditPublish:
        """The write-audit-publish service for this step (lakehouse.wap_service)."""
        return WriteAuditPublish(self, quarantine=quarantine)

    def _after_publish(self, plan: ExtractPlan, outcome: StageOutcome) -> None:
        adapter_for(plan.kind).after_publish(self, plan, outcome)  # checkpoints, cursors, staged copies
        if self.target.export_target_id:
            export_after_publish(self, outcome)  # adds rows/table/duration to outcome.extra
        # lineage + run to DataHub; never raises. Beside the run in a child inside `lakehouse run`
        emit_stage_run(self, plan, outcome, success=True)
