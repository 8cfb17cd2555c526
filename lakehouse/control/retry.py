"""Retry policies (metadata `retry_policies`) → the step's one attempt budget and the delay before each retry.

The policy is looked up at run time (stage `retry_id`, else the pipeline's `default_retry_id`),
so an UPDATE of `retry_policies` applies to the next failure without a code-location reload.
The Dagster layer turns a decision into `RetryRequested(max_retries, seconds_to_wait)`.

**One budget per step.** A step's work (a stage's extract op, or its load op with its publish)
runs at most `1 + max_retries` times in a run, whoever repeats it: a healing action's re-run in the
same execution (lakehouse.control.healing) and a Dagster retry (a new execution) draw from the same
count (`StepBudget`), kept where the operator reads it, in audit_log (`attempts_used`: one row per
heal, `step_failed`/`healing`, and per retry requested, `retry`/`retry_requested`). Without a
retry policy the step is never retried by Dagster and healing's own cap (`healing.max_attempts`)
is the budget. The in-place policies of lakehouse.runtime.retry repeat one call inside one attempt and
are not step attempts (docs/errors.md gives the bound of each).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lakehouse.metadata.model import MetadataCatalog, RetryPolicy

#: Longest single wait, whatever the policy says: an exponential policy must not park a step for hours.
MAX_DELAY_SECONDS = 3600.0


def base_delay(policy: RetryPolicy, retry_number: int) -> float:
    """Delay before retry `retry_number` (1-based), before jitter."""
    n = max(1, retry_number)
    d = policy.delay_seconds
    if policy.backoff == "linear":
        d = d * n
    elif policy.backoff == "exponential":
        d = d * (2 ** (n - 1))
    return min(d, MAX_DELAY_SECONDS)


def delay(policy: RetryPolicy, retry_number: int, rng: random.Random | None = None) -> float:
    """Delay with the policy's jitter: `full` = uniform(0, d), `plus_minus` = d ± 25%."""
    d = base_delay(policy, retry_number)
    r = rng or random
    if policy.jitter == "full":
        d = r.uniform(0, d)
    elif policy.jitter == "plus_minus":
        d = d * r.uniform(0.75, 1.25)
    return round(min(d, MAX_DELAY_SECONDS), 3)


def schedule(policy: RetryPolicy, rng: random.Random | None = None) -> list[float]:
    """Every delay the policy allows, in order (its length is max_retries)."""
    return [delay(policy, i, rng) for i in range(1, policy.max_retries + 1)]


def policy_for(catalog: MetadataCatalog, pipeline_id: str, stage_name: str) -> RetryPolicy | None:
    stage = catalog.stage(pipeline_id, stage_name)
    rid = stage.retry_id or catalog.pipeline(pipeline_id).default_retry_id
    if not rid:
        return None
    return catalog.retry_policy(rid)


#: The audit_log rows that are re-attempts of a step's work: (event, outcome).
_REATTEMPTS = (("step_failed", "healing"), ("retry", "retry_requested"))


def op_of(step: str) -> str:
    """The Dagster op a healing scope or retry belongs to: `extract`, else `load` (load and its publish)."""
    return "extract" if step == "extract" else "load"


def attempts_used(store, run_id: str, pipeline_id: str, stage_name: str, op: str) -> int:
    """Re-attempts of the step `op` of this stage so far in this run, heals and Dagster retries alike."""
    return sum(1 for event, outcome in _REATTEMPTS
               for e in store.audit_entries(pipeline_id=pipeline_id, run_id=run_id, event=event)
               if e.stage_name == stage_name and e.outcome == outcome and op_of(e.details.get("step", "")) == op)


@dataclass(frozen=True)
class StepBudget:
    """Re-attempts a step's work may get after its first run, all layers together."""

    re_attempts: int
    retry_id: str | None  # the policy that sets it; None: no policy, healing's cap is the budget

    def describe(self) -> str:
        return (f"retry policy {self.retry_id!r}: max_retries {self.re_attempts}" if self.retry_id
                else f"no retry policy: healing.max_attempts {self.re_attempts}")


def step_budget(catalog: MetadataCatalog, pipeline_id: str, stage_name: str, healing_cap: int) -> StepBudget:
    policy = policy_for(catalog, pipeline_id, stage_name)
    if policy is None:
        return StepBudget(healing_cap, None)
    return StepBudget(policy.max_retries, policy.retry_id)


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    max_retries: int
    seconds_to_wait: float
    reason: str
    retry_id: str | None = None


def decide(catalog: MetadataCatalog, pipeline_id: str, stage_name: str, retry_number: int,
           retryable: bool = True) -> RetryDecision:
    """Should the step that just failed be retried? `retry_number`: re-attempts it used so far (0 =
    its first run failed), counted by `attempts_used` so heals count too."""
    if not retryable:
        return RetryDecision(False, 0, 0.0, "error is not retryable")
    policy = policy_for(catalog, pipeline_id, stage_name)
    if policy is None:
        return RetryDecision(False, 0, 0.0, "no retry policy for the stage or its pipeline")
    if retry_number >= policy.max_retries:
        return RetryDecision(False, policy.max_retries, 0.0,
                             f"retry policy {policy.retry_id!r} exhausted ({policy.max_retries} retries)",
                             policy.retry_id)
    wait = delay(policy, retry_number + 1)
    return RetryDecision(True, policy.max_retries, wait,
                         f"retry {retry_number + 1}/{policy.max_retries} in {wait}s ({policy.retry_id})",
                         policy.retry_id)


def retry_exception(platform, pipeline_id: str, stage_name: str, run_id: str, retry_number: int,
                    exc: BaseException, step: str):
    """The Dagster `RetryRequested` to raise for a failed step, or None to let it fail.

    Reads the policy from the control DB now; the decision is written to audit_log. The policy's
    `max_retries` bounds the step's re-attempts in all: the heals of earlier executions count.
    """
    from lakehouse.errors import classify

    info = classify(exc)
    if not info.retryable:  # a decision (or a database down past its window): no policy to read
        return None
    used = max(retry_number, attempts_used(platform.store, run_id, pipeline_id, stage_name, op_of(step)))
    try:
        d = decide(platform.store.load(), pipeline_id, stage_name, used, info.retryable)
    except KeyError as lookup:  # a policy id that no longer exists: fail loudly, do not retry blindly
        d = RetryDecision(False, 0, 0.0, f"retry policy lookup failed: {lookup}")
    if info.retryable:
        platform.store.audit(run_id=run_id, pipeline_id=pipeline_id, stage_name=stage_name,
                             event="retry", error_class=info.error_class, message=info.message,
                             action=d.retry_id, outcome="retry_requested" if d.retry else "not_retried",
                             details={"step": step, "code": info.code, "retry_number": retry_number,
                                      "attempts_used": used,
                                      "max_retries": d.max_retries, "seconds_to_wait": d.seconds_to_wait,
                                      "reason": d.reason})
    if not d.retry:
        if step == "extract" and _source_unreachable(exc, info.code):
            from lakehouse.ops import alerts

            alerts.source_unavailable(platform.store, pipeline_id=pipeline_id, stage_name=stage_name, run_id=run_id,
                                      error=exc, retries=retry_number, reason=d.reason)
        return None
    import dagster as dg

    return dg.RetryRequested(max_retries=d.max_retries, seconds_to_wait=d.seconds_to_wait)


def _source_unreachable(exc: BaseException, code: str) -> bool:
    """The extract failed because its source cannot be read (not bad data, not a bug)."""
    from lakehouse.errors import SOURCE_UNAVAILABLE, source_unreachable
    from lakehouse.lineage.recovery import NoRecoveryPath

    return code == SOURCE_UNAVAILABLE or isinstance(exc, NoRecoveryPath) or source_unreachable(exc)
