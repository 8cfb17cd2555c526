"""Never hang: each step's Spark work runs under a deadline.

The step's Spark jobs run in their own job group; a watchdog thread cancels the group when the
timeout passes (`SparkContext.cancelJobGroup`, with `interruptOnCancel`), and keeps cancelling
any job the step starts afterwards, so a job that can never finish (a task-result thread that died
of a StackOverflowError, a lost executor nobody replaces) ends in a `StepTimeout` that names the
timeout and where it came from — an error the healing rules and retry policies see
(code STEP_TIMEOUT), not a run that sits idle forever.

The timeout: the stage's `timeout_seconds` metadata; otherwise derived from the stage's past
successful loads in `audit_log` (FACTOR × the slowest of the last HISTORY, at least FLOOR_S);
never more than the ceiling (platform setting `step_timeout.ceiling_seconds`, env
LAKEHOUSE_STEP_TIMEOUT_CEILING_SECONDS, default six hours), which is also the timeout of a stage
with no history.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import sqlalchemy as sa

from lakehouse.errors import StepTimeout
from lakehouse.runtime.spark import active_session, when_started

if TYPE_CHECKING:
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.stage.core import StageContext

T = TypeVar("T")

DEFAULT_CEILING_S = 6 * 3600.0
FLOOR_S = 600.0
FACTOR = 4.0
HISTORY = 20
_GROUP_PROPS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


@dataclass(frozen=True)
class Deadline:
    seconds: float
    origin: str  # where the value came from, for the error message


def derive(durations_s: list[float], ceiling_s: float) -> Deadline:
    """The timeout from past durations (pure: unit-tested without a database)."""
    if not durations_s:
        return Deadline(ceiling_s, f"the ceiling {ceiling_s:.0f} s (no past run of the stage in audit_log)")
    slowest = max(durations_s)
    derived = max(FLOOR_S, FACTOR * slowest)
    if derived >= ceiling_s:
        return Deadline(ceiling_s, f"the ceiling {ceiling_s:.0f} s ({FACTOR:g} × the slowest of the last "
                                   f"{len(durations_s)} runs, {slowest:.0f} s, is more)")
    return Deadline(derived, f"{FACTOR:g} × the slowest of the last {len(durations_s)} successful runs "
                             f"({slowest:.0f} s), at least {FLOOR_S:.0f} s")


def past_durations(store: MetadataStore, pipeline_id: str, stage_name: str, n: int = HISTORY) -> list[float]:
    """Seconds of the stage's last `n` successful loads (audit_log `published` events)."""
    from lakehouse.metadata.store import audit_log

    store.create_all()
    t = audit_log
    q = (sa.select(t.c.duration_ms).where(t.c.pipeline_id == pipeline_id, t.c.stage_name == stage_name,
                                          t.c.event == "published", t.c.outcome == "success",
                                          t.c.duration_ms.is_not(None))
         .order_by(t.c.id.desc()).limit(n))
    with store.engine.connect() as conn:
        return [ms / 1000.0 for (ms,) in conn.execute(q)]


def ceiling(runner: StageContext) -> float:
    env = runner.platform.settings.step_timeout_ceiling_seconds  # LAKEHOUSE_STEP_TIMEOUT_CEILING_SECONDS
    if env:
        return float(env)
    v = runner.catalog.setting("step_timeout.ceiling_seconds")
    return float(v) if v else DEFAULT_CEILING_S


def step_deadline(runner: StageContext) -> Deadline:
    if runner.stage.timeout_seconds:
        return Deadline(float(runner.stage.timeout_seconds), "stages.timeout_seconds in the metadata")
    top = ceiling(runner)
    return derive(past_durations(runner.platform.store, runner.stage.pipeline_id, runner.stage.stage_name), top)


@contextmanager
def spark_deadline(spark, deadline: Deadline, what: str) -> Iterator[None]:
    """Run the body's Spark jobs in a job group that a watchdog cancels when the deadline passes.

    `spark` is the session, or None when none is up yet: the group is then set when the body
    first gets one (`lakehouse.runtime.spark.when_started`), so a step without Spark work — an extract that
    lists files, a load with nothing new — neither starts the JVM nor waits for the one warming up."""

    group = f"lakehouse-{uuid.uuid4().hex[:16]}"
    bound: dict = {}  # the SparkContext the group is set on, and its thread's properties before

    def bind(session) -> None:
        sc = session.sparkContext
        bound["previous"] = {k: sc.getLocalProperty(k) for k in _GROUP_PROPS}
        sc.setJobGroup(group, what[:200], interruptOnCancel=True)
        bound["sc"] = sc

    fired, done = threading.Event(), threading.Event()

    def watch() -> None:
        if done.wait(deadline.seconds):
            return
        fired.set()
        while not done.is_set():  # a job the step starts after the first cancel is cancelled too
            sc = bound.get("sc")
            if sc is not None:  # no session yet: no Spark job to cancel
                try:
                    sc.cancelJobGroup(group)
                except Exception:  # noqa: BLE001 - a stopped context has nothing left to cancel
                    return
            done.wait(1.0)

    if spark is not None:
        bind(spark)
    watchdog = threading.Thread(target=watch, name=f"deadline-{group}", daemon=True)
    watchdog.start()
    try:
        with when_started(bind) if spark is None else nullcontext():
            yield
    except Exception as exc:
        if fired.is_set():
            raise StepTimeout(
                f"{what}: its Spark work ran longer than the step's timeout of {deadline.seconds:.0f} s "
                f"({deadline.origin}) and was cancelled. Look for a stuck job or a JVM error (StackOverflowError, "
                f"OutOfMemoryError, a lost executor) in the Spark log; raise `timeout_seconds` on the stage if "
                f"the work is just that long.") from exc
        raise
    finally:
        done.set()
        if "sc" in bound:
            for k, v in bound["previous"].items():
                bound["sc"].setLocalProperty(k, v)


def guard_step(runner: StageContext, step: str, work: Callable[[], T]) -> T:
    """`work` under the step's deadline (computed once per step and kept on the runner). The
    session is not started here: the deadline binds to it when the work first asks for it."""
    deadline = runner.__dict__.get("_deadline")
    if deadline is None:
        deadline = runner._deadline = step_deadline(runner)
    what = f"{runner.stage.pipeline_id}.{runner.stage.stage_name} {step}"
    with spark_deadline(active_session(), deadline, what):
        return work()
