"""A stage run's DataHub emission beside the run instead of in its way (issue 21).

Emitting a stage run costs a `lakehouse run` ~0.7 s of CPU, most of it importing acryl-datahub's
schema classes (it builds the Avro schema of every aspect at import), while the process has a
second core doing nothing. Inside `in_background()` (`lakehouse run` wraps its run in it) a stage
run is emitted by a forked child — the child has the parent's modules and the step's state already,
so nothing is loaded twice — while the run goes on with its Dagster events, checks and summary.
Guarantees kept: every proposal is written (or delivered) before `in_background()` ends, i.e.
before `lakehouse run` returns; one emission at a time, so proposals reach DataHub (and its spool)
in the order of the stages; a failed emission never fails the run (the child logs it, as
`emit_stage_run` does in-process). A child that fails, dies or is still running after
LAKEHOUSE_DATAHUB_BACKGROUND_TIMEOUT seconds (default 300: a fork that inherited a lock another
thread held could hang it forever) is killed and its stage emitted again in-process, so no stage's
lineage is lost and `lakehouse run` never hangs on it (proposals are idempotent upserts). Outside it (the UI's run workers, tests, other callers), where
fork is unavailable, or with LAKEHOUSE_DATAHUB_BACKGROUND=0, it emits in-process as before.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from lakehouse.settings import DataHubSettings, current

if TYPE_CHECKING:
    from lakehouse.stage.core import ExtractPlan, StageContext, StageOutcome

log = logging.getLogger(__name__)
ENV = "LAKEHOUSE_DATAHUB_BACKGROUND"
TIMEOUT_ENV = "LAKEHOUSE_DATAHUB_BACKGROUND_TIMEOUT"
_state = {"enabled": False}
_pending: list[tuple[int, tuple]] = []  # (child pid, what it emits: to emit again if it fails)


@contextmanager
def in_background() -> Iterator[None]:
    """Stage runs emitted in a child process until the block ends, which waits for the last one."""
    before = _state["enabled"]
    hooks = current(DataHubSettings)  # LAKEHOUSE_DATAHUB_BACKGROUND, LAKEHOUSE_DATAHUB: read as the run starts
    _state["enabled"] = hasattr(os, "fork") and hooks.datahub_background
    withdraw = None
    if _state["enabled"] and hooks.datahub:
        from lakehouse.runtime.spark import while_starting

        # every child would import acryl-datahub again (~1 s of CPU each, the last one after the
        # run's last Spark job): the parent imports it once, while its first step waits for the JVM
        withdraw = while_starting(_import_emitter)
    try:
        yield
    finally:
        wait()
        if withdraw is not None:
            withdraw()
        _state["enabled"] = before


def _import_emitter() -> None:
    import lakehouse.lineage.datahub  # noqa: F401


def emit_stage_run(runner: StageContext, plan: ExtractPlan | None, outcome: StageOutcome | None, *,
                   success: bool) -> None:
    """`lakehouse.lineage.datahub.emit_stage_run`, in a child process when enabled. Never raises."""
    if not _state["enabled"]:
        _emit_here(runner, plan, outcome, success)
        return
    wait()  # the previous stage's proposals first: DataHub sees them in order
    # a Spark run imports it here once if no wait for the JVM did (the session came up first:
    # `lakehouse run` starts it before its imports): every child inherits it instead of importing
    # it again (~0.7 s each). A run without a session (the Arrow engine, usually one stage) leaves
    # it to its child, beside the run (tests/test_small_run_imports.py)
    from lakehouse.runtime.spark import active_session

    if active_session() is not None:
        _import_emitter()
    try:
        pid = os.fork()
    except OSError as exc:  # no process to spare: emit here
        log.warning("DataHub emission in-process (fork failed: %s)", exc)
        _emit_here(runner, plan, outcome, success)
        return
    if pid == 0:  # the child: emit, then end without running the parent's exit handlers or teardown
        # no cyclic collections in a child that lives for one emission: the collector's counters come
        # from the parent, and a full collection here traverses (and so copies, page by page) the
        # parent's whole heap: ~0.35 s of CPU in a demo run's child, for nothing the exit does not free
        gc.disable()
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
    _pending.append((pid, (runner, plan, outcome, success)))


def _emit_here(runner, plan, outcome, success: bool) -> None:
    from lakehouse.lineage.datahub import emit_stage_run as emit  # acryl-datahub: imported by runs only

    try:
        emit(runner, plan, outcome, success=success)
    except Exception:  # emit_stage_run never raises; whatever did must not fail the run
        log.exception("DataHub emission failed")


def _timeout() -> float:
    return current(DataHubSettings).datahub_background_timeout  # a value that is no number fails as settings are read


def _outcome(pid: int, deadline: float) -> str | None:
    """Why the child did not emit (None: it did, or it was reaped elsewhere); killed at the deadline."""
    _until_exit(pid, deadline)
    delay = 0.005
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (e.g. by a subprocess helper waiting for any child)
            return None
        if done:
            code = os.waitstatus_to_exitcode(status)
            return None if code == 0 else f"ended with {code}"
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "was still running at the deadline and was killed"
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _until_exit(pid: int, deadline: float) -> None:
    """Block until the child exits or the deadline passes, woken at its exit (Linux pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (older kernel, other OS, already reaped): poll
        return
    try:
        select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        os.close(fd)


def wait() -> None:
    """Wait for the emission in flight, if any (the run is not over before its lineage is out)."""
    while _pending:
        pid, args = _pending.pop(0)
        timeout = _timeout()
        why = _outcome(pid, time.monotonic() + timeout)
        if why is None:
            continue
        log.warning("DataHub emission child %d of stage %s %s (%s=%g s); emitting it again in this process",
                    pid, getattr(args[0], "stage", "?"), why, TIMEOUT_ENV, timeout)
        _emit_here(*args)


def _detach_connections(runner: StageContext) -> None:
    """A forked child must not use the parent's database connections (SQLite and PostgreSQL both
    forbid sharing one across fork): each engine the emission may use gets a fresh pool, and the
    parent's connections are left to the parent (SQLAlchemy's `dispose(close=False)`)."""
    from lakehouse.table import catalog

    catalog._LOCK = threading.Lock()  # in case another thread of the parent held it at the fork
    engines = [c.engine for c in list(catalog._CACHE.values()) if getattr(c, "engine", None) is not None]
    store = getattr(runner.platform, "store", None)
    if store is not None and getattr(store, "engine", None) is not None:
        engines.append(store.engine)
    for engine in engines:
        engine.dispose(close=False)
