"""The one wrapper around a stage's steps: deadline, self-healing and the retry policy, on one budget.

`attempt(ctx, step, fn)` runs `fn` under the step's deadline (lakehouse.control.deadline: its Spark
work is cancelled past the timeout), heals a matched error and runs `fn` again in the same
execution (lakehouse.control.healing), and when healing cannot help hands the error to the step's
retry policy (`retry`: the Dagster layer binds lakehouse.control.retry.retry_exception, which
returns a `RetryRequested` or None). Heals and retries draw from the step's one attempt budget
(`lakehouse.control.retry.StepBudget`, counted in audit_log by `attempts_used`): a heal is refused
once the budget is spent, and the retry policy counts the heals of this and earlier executions.

Nothing else in a stage loops over its attempts: the steps of lakehouse.stage.steps run their
work through here (the publish inside the load step too, lakehouse.stage.wap_service, without a deadline
or a retry policy of its own: the load step's are around it). The in-place policies of
lakehouse.runtime.retry repeat one call inside one attempt and are not step attempts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lakehouse.control.deadline import guard_step
from lakehouse.control.healing import run_with_healing
from lakehouse.stage.core import AuditFailed, StageContext, StageDisabled

T = TypeVar("T")

#: a step's retry policy: the exception to raise instead of a failure (a retry request), or None
Retry = Callable[[Exception], BaseException | None]


def attempt(ctx: StageContext, step: str, fn: Callable[[], T], *, retry: Retry | None = None,
            deadline: bool = True) -> T:
    """`fn()` as one step of the stage: under its deadline (`deadline`), healed, then retried by policy.

    A failed audit and a kill switch are decisions, not faults: they pass unchanged. Any other
    error healing left is offered to `retry`; what it returns is raised from the error (None: the
    error itself)."""
    work = (lambda: guard_step(ctx, step, fn)) if deadline else fn
    try:
        return run_with_healing(ctx, step, work)
    except (AuditFailed, StageDisabled):
        raise
    except Exception as exc:
        request = retry(exc) if retry is not None else None
        if request is None:
            raise
        raise request from exc


class Once:
    """A step's retry policy that decides each error once: the wrapper around the step's work and
    the Dagster layer's catch-all around the whole op (resources.io_manager.step_errors) share it,
    so an error the wrapper already offered is not decided (and audited) a second time."""

    def __init__(self, retry: Retry):
        self.retry = retry
        self._decided: list[BaseException] = []

    def __call__(self, exc: Exception) -> BaseException | None:
        if any(e is exc for e in self._decided):
            return None
        self._decided.append(exc)
        request = self.retry(exc)
        if request is not None:  # raised in its place: it is the decision, not a new error
            self._decided.append(request)
        return request
