"""One stage as three steps, each a function of the value before it (docs/ARCHITECTURE.md, "one stage as values"):

    StageRequest ──plan──▶ StagePlan ──stage──▶ StagedWrite ──publish──▶ PublishResult

* `plan(request)`: the kill switches, then the source adapter of the stage's kind plans what to read
  (files, upstream snapshots pinned for the run, a JDBC window, ...), rerouting over the lineage
  graph when the upstream is down;
* `stage(request, plan)`: the engine (Spark, or PyIceberg + Arrow) writes every batch to the run's
  audit branch and evaluates the rules there (`lakehouse.stage.wap_service.WriteAuditPublish`); a failed
  blocking rule raises `AuditFailed` (main untouched, branch kept);
* `publish(staged)`: the kill switch again, the exactly-once publish of the branch (a remainder
  written, audited and published again when another run published part of the input meanwhile),
  then the after-publish bookkeeping (checkpoints, export, lineage).

Each step runs its work once through `lakehouse.control.attempt.attempt` (deadline, healing, retry
policy on the step's one budget). Inside a step the features (adapters, healing actions, the
write-audit-publish service) still see a working `StageContext`: it is built from the request for
that step (`context_for`) and dropped with it; what a later step needs travels in the value
(`StagedWrite` carries the counts, checks, healing trail, the read's report and the branch coordinates), so `publish` works
from a stored reference in a fresh process. `lakehouse.stage.runner.StageRunner` is the facade the
callers of old use: one context for all three steps of a run in one process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lakehouse.control import faults
from lakehouse.control.attempt import Retry, attempt
from lakehouse.engines import choice as engine_choice
from lakehouse.engines import engine_for
from lakehouse.engines.spark import SparkEngine
from lakehouse.export.warehouse import export_after_publish
from lakehouse.lineage.background import emit_stage_run
from lakehouse.lineage.recovery import Reroute, extract_with_recovery, reroute
from lakehouse.platform import Platform
from lakehouse.runtime import coordination
from lakehouse.sources import adapter_for
from lakehouse.stage.core import (
    SKIPPED,
    ExtractPlan,
    StageContext,
    StageDisabled,
    StageOutcome,
)
from lakehouse.stage.values import (
    PublishResult,
    StagedWrite,
    StagePlan,
    StageRequest,
    healing_from_dict,
    healing_to_dict,
    outcome_from_dict,
    outcome_to_dict,
    plain,
)
from lakehouse.stage.wap_service import Audited, WriteAuditPublish, require_enabled
from lakehouse.table.iceberg import MAIN, branch_name_for_run

log = logging.getLogger("lakehouse.stage.runner")

__all__ = ["StagedLoad", "bind", "context_for", "extract", "live", "plan", "publish", "publish_load", "reference",
           "restored", "stage", "write_and_audit"]


# --------------------------------------------------------------------------- the working context

def bind(ctx: StageContext) -> StageContext:
    """Bind the hooks the features below reach up through: the source adapters and the lineage reroute."""
    ctx.adapter_for = adapter_for

    def reroute_target(error: BaseException) -> Reroute:  # healing's switch_to_recovery_path
        return reroute(ctx.platform, ctx.stage.target_id, ctx=ctx, error=error)

    ctx.reroute = reroute_target
    return ctx


def context_for(request: StageRequest, platform: Platform, logger: logging.Logger | None = None) -> StageContext:
    """The working context of one step of `request` (built for the step, dropped with it)."""
    return bind(StageContext(platform, request.pipeline_id, request.stage_name, request.run_id, logger or log,
                             run_tags=dict(request.run_tags)))


# --------------------------------------------------------------------------- the three steps, as values

def plan(request: StageRequest, platform: Platform, *, ctx: StageContext | None = None,
         retry: Retry | None = None) -> StagePlan:
    """Step 1: what the stage will read."""
    return StagePlan.of(extract(ctx or context_for(request, platform), retry=retry))


def stage(request: StageRequest, planned: StagePlan, platform: Platform, *, ctx: StageContext | None = None,
          retry: Retry | None = None) -> StagedWrite:
    """Step 2: the input on the run's audit branch, audited (AuditFailed: a blocking rule failed)."""
    ctx = ctx or context_for(request, platform)
    return reference(ctx, write_and_audit(ctx, planned.extract_plan(), retry=retry))


def publish(staged: StagedWrite, platform: Platform, *, ctx: StageContext | None = None,
            retry: Retry | None = None, logger: logging.Logger | None = None) -> PublishResult:
    """Step 3: the staged write on main, exactly once (or the step skipped, and why). Needs only the
    reference: the branch, the counts and the trail of the write come with it."""
    ctx = ctx or restored(staged, context_for(staged.request, platform, logger))
    return PublishResult.of(publish_load(ctx, live(ctx, staged), retry=retry))


# --------------------------------------------------------------------------- a staged write, live and stored

@dataclass
class StagedLoad:
    """A stage's load between its audit and its publish, in the process that wrote it: `audited`
    None when there is nothing to publish (skipped; `outcome` says why); `engine` the one that
    wrote it (lakehouse.engines.choice), which also writes a remainder. `reference` makes the value
    that outlives the process (`StagedWrite`)."""

    plan: ExtractPlan
    outcome: StageOutcome
    audited: Audited | None = None
    engine: Any = field(default_factory=SparkEngine)

    @property
    def changes_nothing(self) -> bool:
        """Nothing to publish: skipped, nothing new, or a result identical to main (`outcome` says which)."""
        return self.audited is None or self.audited.session is None


def reference(ctx: StageContext, load: StagedLoad, pins: Mapping[str, int | None] | None = None) -> StagedWrite:
    """The serialisable reference of a live staged load (what the IO manager stores)."""
    session = load.audited.session if load.audited is not None else None
    args = session.publish_args() if session is not None else {}
    started = load.audited.started if load.audited is not None else None
    started_at = time.time() - (time.monotonic() - started) if started is not None else time.time()
    return StagedWrite(
        request=StageRequest.of(ctx, pins if pins is not None else load.plan.upstream_snapshots),
        plan=StagePlan.of(load.plan), table=ctx.target.identifier, branch=branch_name_for_run(ctx.run_id),
        engine=getattr(load.engine, "name", "spark"), publishes=session is not None, since=args.get("since"),
        staged_snapshot_id=(session.tables.refs_if_exists(ctx.target.identifier) or {}).get(session.branch)
        if session is not None else None,
        can_rebase=bool(args.get("can_rebase")), quarantine=args.get("quarantine"),
        outcome=outcome_to_dict(load.outcome),
        healing={**healing_to_dict(ctx.healing), "batches_read": ctx.batches_read},
        report=plain(ctx.report), started_at=started_at)


def restored(staged: StagedWrite, ctx: StageContext) -> StageContext:
    """A fresh working context carrying on where the step that staged the write left off: what
    healing changed, the files kept out of the table, and the source a reroute planned to read."""
    ctx.healing = healing_from_dict(staged.healing)
    ctx.batches_read = int(staged.healing.get("batches_read", 0) or 0)
    ctx.report = plain(dict(staged.report))
    if staged.plan.source_id and ctx.stage.source_id and staged.plan.source_id != ctx.stage.source_id:
        ctx.source_override = staged.plan.source_id
    return ctx


class _StagedBranch:
    """The write session of a staged write rebuilt from its reference: all it can do is publish."""

    def __init__(self, ctx: StageContext, tables, staged: StagedWrite):
        self.ctx, self.tables, self.staged = ctx, tables, staged
        self.branch = staged.branch

    def publish(self):
        from lakehouse.engines.audited import publish_branches

        s = self.staged
        return publish_branches(self.ctx.platform, self.tables, s.table, s.branch, since=s.since, run_id=s.run_id,
                                can_rebase=s.can_rebase, quarantine=s.quarantine, ctx=self.ctx)


def live(ctx: StageContext, staged: StagedWrite) -> StagedLoad:
    """The staged load a reference stands for, in this process: its outcome so far, its plan, its
    engine and (when there is something to publish) its branch, ready for `publish_load`."""
    engine = engine_for(staged.engine)
    outcome = outcome_from_dict(staged.outcome, ctx.target)
    started = time.monotonic() - max(0.0, time.time() - staged.started_at)
    audited = (Audited(_StagedBranch(ctx, engine.tables(ctx.platform), staged), outcome, started)
               if staged.publishes else None)
    return StagedLoad(staged.plan.extract_plan(), outcome, audited, engine)


# --------------------------------------------------------------------------- extract

def extract(ctx: StageContext, *, retry: Retry | None = None) -> ExtractPlan:
    """The kill switches, then the plan of what to read (healed and retried as one step)."""
    try:
        require_enabled(ctx, "before extract")
    except StageDisabled as exc:  # a kill switch (pipeline, stage, source, target): nothing to read, the load skips too
        return _skipped_plan(ctx, str(exc))
    upstream_off = _upstream_disabled(ctx)
    if upstream_off:  # a disabled stage upstream in the pipeline: this one skips with it
        ctx.log.warning("%s", upstream_off)
        ctx.audit("kill_switch", outcome="skipped", message=f"before extract: {upstream_off}")
        return _skipped_plan(ctx, upstream_off)
    coordination.hold_lease(ctx.platform, ctx.run_id, ctx.target.identifier)  # claims live with it
    try:
        planned = _extract(ctx, retry)
    except BaseException:
        coordination.release_lease(ctx.platform, ctx.run_id, ctx.target.identifier)
        raise
    coordination.end_step(ctx.platform, ctx.run_id, ctx.target.identifier)
    return planned


def _skipped_plan(ctx: StageContext, reason: str) -> ExtractPlan:
    return ExtractPlan(ctx.stage.pipeline_id, ctx.stage.stage_name, kind=SKIPPED,
                       source_id=ctx.stage.source_id, skipped_reason=reason)


def _upstream_disabled(ctx: StageContext) -> str | None:
    """Why this stage skips with a disabled stage upstream of it in its pipeline (None: it does not)."""
    from lakehouse.control.flags import upstream_disabled

    def tables_read() -> dict[str, list[str]]:
        from lakehouse.metadata.derived import read_structure

        structure = read_structure(ctx.platform.store, [ctx.stage.pipeline_id])
        return {s: list(d.upstream_tables) for (p, s), d in structure.derived.items()
                if p == ctx.stage.pipeline_id}

    return upstream_disabled(ctx.catalog, ctx.stage.pipeline_id, ctx.stage.stage_name, tables_read)


def _extract(ctx: StageContext, retry: Retry | None) -> ExtractPlan:
    # probes the default upstream and reroutes over the lineage graph when it is down;
    # any other matched error is healed (healing_actions) and the extract retried in this step
    def work() -> ExtractPlan:
        faults.inject("extract", ctx, source_id=ctx.source_override or ctx.stage.source_id)
        return extract_with_recovery(ctx, lambda: _plan_extract(ctx))

    planned = attempt(ctx, "extract", work, retry=retry)
    if ctx.healing.events:
        planned.details.update({f"extract_{k}": v for k, v in ctx.healing.summary().items()})
    return planned


def _plan_extract(ctx: StageContext) -> ExtractPlan:
    src = ctx.source
    kind = ctx.source_kind
    adapter = adapter_for(kind)
    planned = ExtractPlan(ctx.stage.pipeline_id, ctx.stage.stage_name, kind=kind,
                          source_id=src.source_id if src else None)
    if adapter.plans_against_main:
        tables = ctx.platform.tables()  # read before anything is planned: later commits get checked
        planned.main_at_plan = (tables.refs_if_exists(ctx.target.identifier) or {}).get(MAIN)
    adapter.plan(ctx, src, planned)
    return planned


# --------------------------------------------------------------------------- write and audit

def write_and_audit(ctx: StageContext, planned: ExtractPlan, *, retry: Retry | None = None) -> StagedLoad:
    """Every batch on the run's audit branch, the rules evaluated there (`outcome.checks`); main
    untouched. A failed blocking rule raises AuditFailed (branch kept). A matched error is healed
    and the write restarts from a fresh audit branch in the same step; the trail lands in
    audit_log and in the materialization metadata."""
    try:
        if planned.kind == SKIPPED:  # the extract skipped it (a kill switch): skipped here too, without I/O
            require_enabled(ctx, "before load")  # still off: its own reason
            return StagedLoad(planned, wap(ctx).skip_disabled(planned.skipped_reason or "skipped"))
        # the Spark work of each attempt is cancelled past the step's timeout (never a hung run)
        return attempt(ctx, "load", lambda: _stage(ctx, planned), retry=retry)
    except StageDisabled as exc:  # switched off: nothing reaches main, the step is skipped (not a failure)
        return StagedLoad(planned, wap(ctx).skip_disabled(str(exc)))
    except BaseException:  # the step ends here: its claims and the lease with it
        coordination.release_lease(ctx.platform, ctx.run_id, ctx.target.identifier)
        raise


def _stage(ctx: StageContext, planned: ExtractPlan) -> StagedLoad:
    t0 = time.monotonic()
    choice = engine_choice.choose(ctx, planned)  # Spark, or PyIceberg + Arrow (no JVM) for small file loads
    engine = engine_for(choice)
    tables = engine.tables(ctx.platform)
    branch = branch_name_for_run(ctx.run_id)
    outcome = StageOutcome(ctx.stage.pipeline_id, ctx.stage.stage_name, ctx.target, False, branch)
    outcome.extra.update(choice.metadata())
    require_enabled(ctx, "before load")
    outcome.extra.update(wap(ctx).tidy_branches(tables))
    if branch in (tables.refs_if_exists(ctx.target.identifier) or {}):
        # a retry of this step (healing or a Dagster retry): start over, never append twice
        tables.drop_branch(ctx.target.identifier, branch)
    if planned.source_id and ctx.stage.source_id and planned.source_id != ctx.stage.source_id:
        ctx.source_override = planned.source_id  # the extract rerouted: read what it planned
    if planned.skipped_reason:
        outcome.skipped_reason = planned.skipped_reason
        outcome.published = True
        outcome.snapshot_id = (tables.refs_if_exists(ctx.target.identifier) or {}).get(MAIN)
        outcome.duration_s = time.monotonic() - t0
        return StagedLoad(planned, outcome)
    ctx.audit("stage_started", details={"plan": planned.details, "kind": planned.kind, **choice.metadata()})
    audited = WriteAuditPublish(ctx, engine=engine).write_and_audit(
        engine.batches(ctx, planned), outcome=outcome, started=t0, since=planned.main_at_plan)
    return StagedLoad(planned, outcome, audited, engine)


# --------------------------------------------------------------------------- publish

def publish_load(ctx: StageContext, staged: StagedLoad, *, retry: Retry | None = None) -> StageOutcome:
    """The kill switch read again, then the exactly-once publish (and the remainder written, audited
    and published again when another run published part of the input meanwhile). A healed error
    here starts the load over from a fresh audit branch: the publish is part of the load step and
    spends its budget."""
    pending = [staged]

    def work() -> StageOutcome:
        return _publish(ctx, pending.pop() if pending else _stage(ctx, staged.plan))

    try:
        outcome = attempt(ctx, "load", work, retry=retry)
    except StageDisabled as exc:  # switched off in flight: nothing reaches main, the step is skipped
        return wap(ctx).skip_disabled(str(exc))
    finally:  # claims and the lease end with the step, whatever happened
        coordination.release_lease(ctx.platform, ctx.run_id, ctx.target.identifier)
    outcome.extra.update({k: v for k, v in staged.plan.details.items() if k.startswith("extract_heal")})
    if ctx.healing.events or ctx.healing.total_attempts:
        outcome.extra.update(ctx.healing.summary())
    # unreadable files kept out of the table in this run (why: the audit log, event file_quarantined)
    files = {q["key"] for q in ctx.report.get("quarantined_files") or []} | set(ctx.healing.quarantined_files)
    if files:
        outcome.extra["files_quarantined"] = len(files)
    return outcome


def _publish(ctx: StageContext, staged: StagedLoad) -> StageOutcome:
    if staged.audited is None:  # nothing to publish (skipped)
        return staged.outcome
    engine = staged.engine
    published = WriteAuditPublish(ctx, engine=engine).write_exactly_once(
        staged.plan, lambda p: engine.batches(ctx, p), staged.outcome, staged.audited.started,
        audited=staged.audited)
    if published is not None:
        _after_publish(ctx, published, staged.outcome)
    return staged.outcome


def wap(ctx: StageContext, *, quarantine: bool = True) -> WriteAuditPublish:
    """The write-audit-publish service for this step (lakehouse.stage.wap_service)."""
    return WriteAuditPublish(ctx, quarantine=quarantine)


def _after_publish(ctx: StageContext, planned: ExtractPlan, outcome: StageOutcome) -> None:
    adapter_for(planned.kind).after_publish(ctx, planned, outcome)  # checkpoints, cursors, staged copies
    if ctx.target.export_target_id:
        export_after_publish(ctx, outcome)  # adds rows/table/duration to outcome.extra
    # lineage + run to DataHub; never raises. Beside the run in a child inside `lakehouse run`
    emit_stage_run(ctx, planned, outcome, success=True)

