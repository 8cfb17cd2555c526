"""A stage run's DataHub emission beside the run instead of in its way (issue 21).

Emitting a stage run costs a `lakehouse run` ~0.7 s of CPU, most of it importing acryl-datahub's
schema classes (it builds the Avro schema of every aspect at import), while the process has a
second core doing nothing. Inside `in_background()` (`lakehouse run` wraps its run in it) a stage
run is emitted by a forked child — the child has the parent's modules and the step's state already,
so nothing is loaded twice — while the run goes on with its Dagster events, checks and summary.
Guarantees kept: every proposal is written (or delivered) before `in_background()` ends, i.e.
before `lakehouse run` returns; one emission at a time, so proposals reach DataHub (and its spool)
in the order of the stages; a failed emission never fails the run (the child logs it, as
`emit_stage_run` does in-process). Outside it (the UI's run workers, tests, other callers), where
fork is unavailable, or with LAKEHOUSE_DATAHUB_BACKGROUND=0, it emits in-process as before.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lakehouse.core import ExtractPlan, StageContext, StageOutcome

log = logging.getLogger(__name__)
ENV = "LAKEHOUSE_DATAHUB_BACKGROUND"
_state = {"enabled": False}
_pending: list[int] = []


@contextmanager
def in_background() -> Iterator[None]:
    """Stage runs emitted in a child process until the block ends, which waits for the last one."""
    before = _state["enabled"]
    _state["enabled"] = hasattr(os, "fork") and os.environ.get(ENV, "1").strip().lower() not in (
        "0", "off", "false", "no")
    try:
        yield
    finally:
        wait()
        _state["enabled"] = before


def emit_stage_run(runner: StageContext, plan: ExtractPlan | None, outcome: StageOutcome | None, *,
                   success: bool) -> None:
    """`lakehouse.lineage.datahub.emit_stage_run`, in a child process when enabled. Never raises."""
    if not _state["enabled"]:
        from lakehouse.lineage.datahub import emit_stage_run as emit  # acryl-datahub: imported by runs only

        emit(runner, plan, outcome, success=success)
        return
    wait()  # the previous stage's proposals first: DataHub sees them in order
    try:
        pid = os.fork()
    except OSError as exc:  # no process to spare: emit here
        log.warning("DataHub emission in-process (fork failed: %s)", exc)
        from lakehouse.lineage.datahub import emit_stage_run as emit

        emit(runner, plan, outcome, success=success)
        return
    if pid == 0:  # the child: emit, then end without running the parent's exit handlers or teardown
        code = 0
        try:
            _detach_connections(runner)
            from lakehouse.lineage.datahub import emit_stage_run as emit

            emit(runner, plan, outcome, success=success)
        except BaseException:  # emit_stage_run never raises; this is the child's own failure
            log.exception("DataHub emission child failed")
            code = 1
        finally:
            os._exit(code)  # no exit handlers, no flush of buffers the parent still owns
    _pending.append(pid)


def wait() -> None:
    """Wait for the emission in flight, if any (the run is not over before its lineage is out)."""
    while _pending:
        pid = _pending.pop(0)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # already reaped (e.g. by a subprocess helper waiting for any child)
            continue
        if os.waitstatus_to_exitcode(status) != 0:
            log.warning("DataHub emission child %d ended with %s", pid, os.waitstatus_to_exitcode(status))


def _detach_connections(runner: StageContext) -> None:
    """A forked child must not use the parent's database connections (SQLite and PostgreSQL both
    forbid sharing one across fork): each engine the emission may use gets a fresh pool, and the
    parent's connections are left to the parent (SQLAlchemy's `dispose(close=False)`)."""
    from lakehouse import catalog

    catalog._LOCK = threading.Lock()  # in case another thread of the parent held it at the fork
    engines = [c.engine for c in list(catalog._CACHE.values()) if getattr(c, "engine", None) is not None]
    store = getattr(runner.platform, "store", None)
    if store is not None and getattr(store, "engine", None) is not None:
        engines.append(store.engine)
    for engine in engines:
        engine.dispose(close=False)
