"""The one way the platform repeats a call in place: a named policy, run by tenacity.

Each place that retries a call in place names its policy here (`POLICIES`), so that the attempts a
call gets are written once and read in docs/errors.md; nothing else in the package loops over
attempts. A policy retries only errors whose kind is `transient` (lakehouse.errors) and whose code
it lists, plus what its `also` predicate accepts (facts about the call, such as "the branch head did
not move", never message words). Everything else is raised at once, to the layer above: the step,
whose one attempt budget healing and the step's retry policy share (lakehouse.control.retry).

In-place policies repeat one call inside one attempt of a step; they are not step attempts. Two
kinds: `InPlace` (a number of calls) and `Window` (a time window: riding out a database outage,
lakehouse.runtime.outage, where the window is shared by every call to that database).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from lakehouse import errors

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class InPlace:
    """How often and on what one call is repeated where it is made."""

    name: str
    attempts: int  # calls in all, the first one included
    codes: frozenset[str]  # transient error codes it repeats
    first_wait_s: float = 0.2
    max_wait_s: float = 2.0
    log_level: int = logging.WARNING  # of the line each repeat logs

    def wait_s(self, attempt: int) -> float:
        """Wait after failed call `attempt` (1-based): doubling from first_wait_s, capped."""
        return min(self.first_wait_s * (2 ** (attempt - 1)), self.max_wait_s)


_COMMIT_CODES = frozenset({errors.ICEBERG_COMMIT_CONFLICT, errors.DATABASE_BUSY})

#: A small Iceberg metadata commit (create/drop a branch, add columns): Iceberg does not retry it.
METADATA_COMMIT = InPlace("metadata_commit", attempts=8, codes=_COMMIT_CODES)
#: An append to the run's own audit branch that a busy catalog refused (only while the head did not move).
BRANCH_WRITE = InPlace("branch_write", attempts=4, codes=_COMMIT_CODES, first_wait_s=0.5, max_wait_s=4.0)
#: The publish compare-and-swap: main moved between reading it and committing; each attempt reads main again.
PUBLISH = InPlace("publish", attempts=20, codes=_COMMIT_CODES, first_wait_s=0.0, max_wait_s=0.0,
                  log_level=logging.INFO)  # concurrent publishers meet here as a matter of course
#: Spark's catalog not yet seeing a branch that PyIceberg already sees (a just-created branch).
BRANCH_LOAD = InPlace("branch_load", attempts=4, codes=frozenset(), first_wait_s=0.25, max_wait_s=1.0)

#: Two processes creating the Iceberg catalog's tables at once: the loser opens it again.
CREATE_RACE = InPlace("create_race", attempts=5, codes=frozenset(), first_wait_s=0.2, max_wait_s=1.0)
#: Two processes inserting the same key (a work claim, a throttle bucket): the loser reads again.
INSERT_RACE = InPlace("insert_race", attempts=5, codes=frozenset(), first_wait_s=0.0, max_wait_s=0.0,
                      log_level=logging.INFO)


@dataclass(frozen=True)
class Window:
    """A call repeated while a condition lasts, bounded by time (the caller's window), not by calls."""

    name: str
    first_wait_s: float = 0.5
    max_wait_s: float = 5.0

    def wait_s(self, attempt: int, remaining_s: float) -> float:
        """Doubling from first_wait_s, capped, and never past the end of the window."""
        return min(self.first_wait_s * (2 ** (attempt - 1)), self.max_wait_s, max(0.1, remaining_s))


#: A control-DB / catalog database that cannot be reached: `outage.window_seconds` (lakehouse.runtime.outage).
OUTAGE = Window("outage")

POLICIES = {p.name: p for p in (METADATA_COMMIT, BRANCH_WRITE, PUBLISH, BRANCH_LOAD, CREATE_RACE, INSERT_RACE)}
WINDOWS = {OUTAGE.name: OUTAGE}


def retries(policy: InPlace, exc: BaseException, also: Callable[[BaseException], bool] | None = None,
            only: Callable[[BaseException], bool] | None = None) -> bool:
    """Would `policy` repeat the call after `exc`? `only`: a fact about the call every repeat needs;
    `also`: a fact that makes a non-terminal error worth repeating besides the policy's codes."""
    if isinstance(exc, errors.Terminal) or (only is not None and not only(exc)):
        return False
    info = errors.classify(exc)
    if info.transient and info.code in policy.codes:
        return True
    return also is not None and info.kind != errors.TERMINAL and also(exc)


def call(policy: InPlace, fn: Callable[[], T], *, what: str,
         also: Callable[[BaseException], bool] | None = None,
         only: Callable[[BaseException], bool] | None = None,
         before_retry: Callable[[BaseException], None] | None = None,
         sleep: Callable[[float], None] = time.sleep) -> T:
    """`fn()`, repeated up to `policy.attempts` calls in all while `retries(policy, error, also, only)`;
    `before_retry(error)` runs before each repeat (refresh a cached table, ...). The last error is
    raised as it was."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()
        log.log(policy.log_level, "%s (%s): attempt %d/%d failed, retrying: %s", what, policy.name,
                state.attempt_number, policy.attempts, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200])
        if before_retry is not None:
            before_retry(exc)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=lambda state: policy.wait_s(state.attempt_number),
        retry=tenacity.retry_if_exception(lambda exc: retries(policy, exc, also, only)),
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
    return retrying(fn)


def call_within(policy: Window, fn: Callable[[], T], *, what: str, retry_on: Callable[[BaseException], bool],
                remaining_s: Callable[[], float], sleep: Callable[[float], None] = time.sleep) -> T:
    """`fn()`, repeated while `retry_on(error)` and `remaining_s()` (of the caller's window) is above
    zero. The last error is raised as it was: the caller says what an expired window means."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()
        log.warning("%s (%s): attempt %d failed, %.1fs of the window left, retrying: %s", what, policy.name,
                    state.attempt_number, remaining_s(), (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200])

    retrying = tenacity.Retrying(
        stop=lambda state: remaining_s() <= 0,
        wait=lambda state: policy.wait_s(state.attempt_number, remaining_s()),
        retry=tenacity.retry_if_exception(retry_on),
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
    return retrying(fn)
