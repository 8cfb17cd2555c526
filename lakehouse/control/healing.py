"""Self-healing inside a step: classify the error, run the matching resolution actions, retry.

`healing_actions` rows pair a matcher (error code, exception class name, message regex) with an
ordered list of built-in actions. On a failure the step's work is retried in the same run after
the first matching rule's actions ran, so a healed step simply succeeds. Two bounds make sure
nothing loops: a rule heals at most `max_attempts` times per step, a step heals at most
`global_cap()` times in all (platform setting `healing.max_attempts`, env
LAKEHOUSE_HEALING_MAX_ATTEMPTS, default 10), and every heal is a re-attempt of the step drawn from
its one budget, which Dagster retries share (`lakehouse.control.retry.StepBudget`: the retry
policy's `max_retries`), so healing and the step's retry policy never multiply. Every failure,
action and outcome goes to audit_log.

Each action is a plain function `(ActionContext) -> ActionResult`; the ones that change how the
step runs (smaller batches, skipped files, another source) record it on `HealingState`, which the
runner reads. Actions reach the input only through the step's context: the source adapter
(`file_readable`, `quarantine_files`) and the reroute the runner binds (`StageContext.reroute`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lakehouse.control.retry import attempts_used, op_of, step_budget
from lakehouse.errors import ErrorInfo, classify
from lakehouse.ingest.files import gone_or_changed, note_deferred_files
from lakehouse.metadata.model import HealingAction
from lakehouse.runtime import spark as spark_mod
from lakehouse.settings import RunSettings, current
from lakehouse.stage.core import HealingState, NoRecoveryPath, StageContext

T = TypeVar("T")

DEFAULT_GLOBAL_CAP = 10
MAX_BACKOFF_SECONDS = 300.0


@dataclass
class ActionContext:
    runner: StageContext
    error: ErrorInfo
    exc: BaseException
    rule: HealingAction
    attempt: int  # 1-based attempt of this rule in this step
    step: str

    @property
    def state(self) -> HealingState:
        return self.runner.healing


@dataclass
class ActionResult:
    outcome: str  # applied | not_applicable | failed
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def applied(self) -> bool:
        return self.outcome == "applied"


# --------------------------------------------------------------------------- matching


def matches(rule: HealingAction, error: ErrorInfo) -> bool:
    """Every matcher the rule sets must match (code, class name in the chain, message regex)."""
    if rule.error_code and rule.error_code != error.code:
        return False
    if rule.error_class and not any(
        n == rule.error_class or n.rsplit(".", 1)[-1] == rule.error_class for n in error.class_names
    ):
        return False
    if rule.message_regex and not re.search(rule.message_regex, error.message, re.S):
        return False
    return True


def matching_rules(rules: list[HealingAction], error: ErrorInfo) -> list[HealingAction]:
    """Matching rules, lowest `priority` value first (then by id, so the order is stable)."""
    return sorted((r for r in rules if matches(r, error)), key=lambda r: (r.priority, r.healing_id))


def global_cap(runner: StageContext | None = None) -> int:
    env = (runner.platform.settings if runner is not None else current(RunSettings)).healing_max_attempts
    if env is not None:  # LAKEHOUSE_HEALING_MAX_ATTEMPTS
        return max(0, env)
    if runner is not None:
        v = runner.catalog.setting("healing.max_attempts")
        if v is not None:
            return max(0, int(v))
    return DEFAULT_GLOBAL_CAP


# --------------------------------------------------------------------------- built-in actions


def retry_after_backoff(ctx: ActionContext, sleep: Callable[[float], None] = time.sleep) -> ActionResult:
    """Wait backoff_seconds × 2^(attempt-1) (capped), then let the step retry."""
    wait = min(ctx.rule.backoff_seconds * (2 ** (ctx.attempt - 1)), MAX_BACKOFF_SECONDS)
    sleep(wait)
    return ActionResult("applied", f"waited {wait:.2f}s", {"waited_s": wait})


def refresh_and_recommit(ctx: ActionContext) -> ActionResult:
    """A commit conflict: drop Spark's cached table state so the retried commit sees main as it is now.

    The retried publish re-reads main's ref and cherry-picks onto it when main moved, which is
    Iceberg's own re-validation of our snapshots against the concurrent ones.
    """
    tables = ctx.runner.platform.tables()
    ident = ctx.runner.target.identifier
    if not tables.exists(ident):
        return ActionResult("not_applicable", f"{ident} does not exist yet")
    tables.spark.catalog.refreshTable(tables.qualified(ident))
    return ActionResult("applied", f"refreshed {ident} (main at {tables.snapshot_id(ident)})",
                        {"main_snapshot": tables.snapshot_id(ident)})


def schema_policy(runner: StageContext) -> str:
    """The stage's schema policy (StageContext.schema_policy: the schema_contract rule, else the
    target's table property, else `evolve`)."""
    return runner.schema_policy()


def evolve_schema(ctx: ActionContext) -> ActionResult:
    """New input columns: add them to the table (never drop or retype), when the policy allows."""
    runner = ctx.runner
    policy = schema_policy(runner)
    if policy != "evolve":
        return ActionResult("not_applicable", f"schema policy of stage {runner.stage.stage_name!r} is {policy!r}")
    batch = runner.current_batch
    if batch is None:
        return ActionResult("not_applicable", "no input batch to take the new columns from")
    tables = runner.platform.tables()
    ident = runner.target.identifier
    if not tables.exists(ident):
        return ActionResult("not_applicable", f"{ident} does not exist yet")
    added = tables.add_missing_columns(ident, batch.df.schema)
    if not added:
        return ActionResult("not_applicable", "the input has no columns the table lacks")
    return ActionResult("applied", f"added column(s) {', '.join(added)} to {ident}", {"added_columns": added})


def _corrupt_files(ctx: ActionContext, candidates: list) -> list:
    """Files of the failed batch that the error names, else those that fail to read on their own."""
    text = ctx.error.message
    named = [f for f in candidates if f.local_path and f.local_path in text]
    named = named or [f for f in candidates if re.search(r"(?<![\w.-])" + re.escape(f.key) + r"(?![\w.-])", text)]
    if named:
        return named
    adapter = ctx.runner.adapter()
    return [f for f in candidates if not adapter.file_readable(ctx.runner, f)]


def quarantine_input(ctx: ActionContext) -> ActionResult:
    """A corrupt file: copy it to <home>/quarantine/files/…, skip it, and continue with the rest.

    The file is recorded in the batch's checkpoint as quarantined (so the next run does not pick it
    up again) and in audit_log; the landing zone itself is left untouched.
    """
    batch = ctx.runner.current_batch
    files = list(getattr(batch, "files", None) or [])
    if not files:
        return ActionResult("not_applicable", "no input files in the failed batch")
    files = [f for f in files if f.key not in ctx.state.quarantined_files]
    # a file that vanished or changed since the plan is not corrupt: left for the next run, which
    # plans what is there then (nothing recorded for it), and skipped by the retry
    gone = {f.key: why for f in files if (why := gone_or_changed(f)) is not None}
    if gone:
        note_deferred_files(ctx.runner, [f for f in files if f.key in gone], gone)
        ctx.state.skipped_files.update(gone)
    bad = _corrupt_files(ctx, [f for f in files if f.key not in gone])
    if not bad:
        if gone:
            return ActionResult("applied", f"left {', '.join(sorted(gone))} for the next run (vanished or changed)",
                                {"deferred": sorted(gone)})
        return ActionResult("not_applicable", "no unreadable file found in the failed batch")
    for f in bad:
        ctx.state.quarantined_files[f.key] = ctx.error.code
    # the source's adapter records them in the ingestion checkpoints (the next run does not plan
    # them again) and copies them aside
    moved = ctx.runner.adapter().quarantine_files(ctx.runner, bad, f"{ctx.error.code}: {ctx.error.message[:500]}")
    return ActionResult("applied", f"quarantined {', '.join(f.key for f in bad)}",
                        {"files": [f.key for f in bad], "copied_to": moved})


def shrink_batch(ctx: ActionContext) -> ActionResult:
    """Memory pressure: halve the number of files per commit (not below one)."""
    src = ctx.runner.source
    configured = getattr(src, "batch_files", None)
    batch = ctx.runner.current_batch
    current = len(getattr(batch, "files", None) or []) or (
        ctx.state.effective_batch(configured) if configured else 0)
    if current <= 1:
        return ActionResult("not_applicable", "the batch is already a single file/unit")
    ctx.state.batch_scale /= 2
    new = ctx.state.effective_batch(configured) if configured else None
    data = {"batch_scale": ctx.state.batch_scale, "batch_files": new}
    max_bytes = getattr(src, "batch_bytes", None)  # file batches end at a byte bound too: halved alike
    if max_bytes:
        data["batch_bytes"] = ctx.state.effective_batch(max_bytes)
    bound = f"{new or 'half'} file(s)" + (f" / {data['batch_bytes']} bytes" if max_bytes else "")
    return ActionResult("applied", f"batch halved to {bound}", data)


def restart_spark_session(ctx: ActionContext, stop: Callable[[], None] | None = None,
                          start: Callable[[], Any] | None = None) -> ActionResult:
    """Stop the process's SparkSession and build a fresh one (same settings, same catalog)."""
    (stop or spark_mod.stop_spark)()
    session = (start or ctx.runner.platform.spark)()
    return ActionResult("applied", "restarted the Spark session",
                        {"app_id": getattr(getattr(session, "sparkContext", None), "applicationId", None)})


def switch_to_recovery_path(ctx: ActionContext) -> ActionResult:
    """Source unavailable: follow the cheapest available route of the lineage graph (which includes
    a source's declared `alternative_source_id` replica; docs/lineage.md)."""
    runner = ctx.runner
    if runner.reroute is None:  # bound by the runner: lakehouse.lineage.recovery.reroute
        return ActionResult("not_applicable", "no lineage reroute is bound to this step")
    try:
        decision = runner.reroute(ctx.exc)
    except NoRecoveryPath as exc:
        return ActionResult("not_applicable", str(exc))
    runner.source_override = decision.to_dataset_id
    return ActionResult("applied", f"rerouted to {decision.to_dataset_id} via lineage",
                        {"to": decision.to_dataset_id, "path": list(decision.path)})


def command_argv(command: str) -> list[str]:
    """`py:package.module:function` runs a Python entry point; anything else is a shell-free argv."""
    if command.startswith("py:"):
        target = command[3:]
        mod, _, fn = target.partition(":")
        if not mod or not fn or not all(p.isidentifier() for p in [*mod.split("."), fn]):
            raise ValueError(f"run_command: {command!r} is not py:<module>:<function>")
        return [sys.executable, "-c", f"import {mod} as m, sys; r = m.{fn}(); sys.exit(0 if r in (None, True, 0) else 1)"]
    return shlex.split(command)


def run_command(ctx: ActionContext) -> ActionResult:
    """A user's command or Python entry point, with a timeout; the error comes in LAKEHOUSE_HEAL_* env."""
    rule, runner = ctx.rule, ctx.runner
    argv = command_argv(rule.command or "")
    env = {**os.environ,
           "LAKEHOUSE_HEAL_RUN_ID": runner.run_id,
           "LAKEHOUSE_HEAL_PIPELINE": runner.stage.pipeline_id,
           "LAKEHOUSE_HEAL_STAGE": runner.stage.stage_name,
           "LAKEHOUSE_HEAL_ERROR_CODE": ctx.error.code,
           "LAKEHOUSE_HEAL_ERROR_CLASS": ctx.error.error_class,
           "LAKEHOUSE_HEAL_MESSAGE": ctx.error.message[:2000],
           "LAKEHOUSE_HEAL_ATTEMPT": str(ctx.attempt)}
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=rule.command_timeout_seconds)
    except subprocess.TimeoutExpired:
        return ActionResult("failed", f"command timed out after {rule.command_timeout_seconds}s")
    except OSError as exc:
        return ActionResult("failed", f"command could not start: {exc}")
    tail = (proc.stdout + proc.stderr).strip()[-500:]
    if proc.returncode != 0:
        return ActionResult("failed", f"command exited {proc.returncode}: {tail}")
    return ActionResult("applied", f"command succeeded: {tail}" if tail else "command succeeded")


ACTIONS: dict[str, Callable[[ActionContext], ActionResult]] = {
    "retry_after_backoff": retry_after_backoff,
    "refresh_and_recommit": refresh_and_recommit,
    "evolve_schema": evolve_schema,
    "quarantine_input": quarantine_input,
    "shrink_batch": shrink_batch,
    "restart_spark_session": restart_spark_session,
    "switch_to_recovery_path": switch_to_recovery_path,
    "run_command": run_command,
}


# --------------------------------------------------------------------------- the loop


def _event(runner: StageContext, record: dict[str, Any], **audit: Any) -> None:
    runner.healing.events.append(record)
    runner.audit(**audit)


def run_with_healing(runner: StageContext, step: str, work: Callable[[], T],
                     rules: Callable[[], list[HealingAction]] | None = None) -> T:
    """Run `work`; on a matched error run the rule's actions and run `work` again (bounded)."""
    state = runner.healing
    load_rules = rules or (lambda: runner.platform.store.load().healing_actions)
    used: list[str] = []  # actions applied in this scope, for the final "healed" record
    while True:
        t0 = time.monotonic()
        try:
            result = work()
        except Exception as exc:
            info = classify(exc)
            if not info.retryable:
                raise
            elapsed = int((time.monotonic() - t0) * 1000)
            candidates = matching_rules(load_rules(), info)
            rule = next((r for r in candidates if state.attempts[r.healing_id] < r.max_attempts), None)
            base = {"step": step, "code": info.code, "error_class": info.error_class,
                    "message": info.message[:300]}
            if rule is None:
                why = ("no healing action matches" if not candidates else
                       f"healing action(s) {', '.join(r.healing_id for r in candidates)} used all their attempts")
                _event(runner, {**base, "outcome": "unhealed", "reason": why}, event="healing",
                       error_class=info.error_class, message=info.message, outcome="unhealed",
                       duration_ms=elapsed, details={"step": step, "code": info.code, "reason": why})
                raise
            cap = global_cap(runner)
            budget = step_budget(runner.catalog, runner.stage.pipeline_id, runner.stage.stage_name, cap)
            spent = attempts_used(runner.platform.store, runner.run_id, runner.stage.pipeline_id,
                                  runner.stage.stage_name, op_of(step))
            why = None
            if state.total_attempts >= cap:
                why = f"global healing cap of {cap} attempts per step reached"
            elif spent >= budget.re_attempts:  # heals and Dagster retries share the step's one budget
                why = f"the step's attempt budget is spent ({spent} re-attempt(s); {budget.describe()})"
            if why is not None:
                _event(runner, {**base, "outcome": "exhausted", "reason": why}, event="healing",
                       error_class=info.error_class, message=info.message, outcome="exhausted",
                       duration_ms=elapsed, details={"step": step, "code": info.code, "reason": why})
                raise
            state.attempts[rule.healing_id] += 1
            state.total_attempts += 1
            attempt = state.attempts[rule.healing_id]
            runner.audit("step_failed", error_class=info.error_class, message=info.message, outcome="healing",
                         action=rule.healing_id, duration_ms=elapsed,
                         details={"step": step, "code": info.code, "attempt": attempt,
                                  "max_attempts": rule.max_attempts})
            ctx = ActionContext(runner, info, exc, rule, attempt, step)
            applied = False
            for name in rule.actions:
                a0 = time.monotonic()
                try:
                    res = ACTIONS[name](ctx)
                except Exception as action_exc:  # noqa: BLE001 - an action failing must not hide the error
                    res = ActionResult("failed", f"{type(action_exc).__name__}: {action_exc}")
                dur = int((time.monotonic() - a0) * 1000)
                applied = applied or res.applied
                if res.applied:
                    used.append(name)
                _event(runner, {**base, "healing_id": rule.healing_id, "attempt": attempt, "action": name,
                                "outcome": res.outcome, "detail": res.detail[:300]},
                       event="healing_action", error_class=info.error_class, message=info.message,
                       action=name, outcome=res.outcome, duration_ms=dur,
                       details={"step": step, "code": info.code, "healing_id": rule.healing_id,
                                "attempt": attempt, "detail": res.detail, **res.data})
                if res.outcome == "failed":
                    break
            if not applied:
                runner.audit("healing", error_class=info.error_class, message=info.message, outcome="unhealed",
                             action=rule.healing_id,
                             details={"step": step, "code": info.code, "reason": "no action applied"})
                raise
            runner.log.warning("%s.%s %s: %s (%s) — healed by %s, retrying (attempt %d/%d)",
                               runner.stage.pipeline_id, runner.stage.stage_name, step, info.code,
                               info.message[:200], rule.healing_id, attempt, rule.max_attempts)
            continue
        if used:
            _event(runner, {"step": step, "outcome": "healed", "actions": used},
                   event="healing", outcome="healed", action=",".join(dict.fromkeys(used))[:64],
                   duration_ms=int((time.monotonic() - t0) * 1000),
                   details={"step": step, "attempts": state.total_attempts, "actions": used})
        return result
