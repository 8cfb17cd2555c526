"""A code server's run workers start from a preloaded fork server, not from a fresh interpreter.

Dagster's DefaultRunLauncher asks the code server to start a run; the server starts the run worker
as a `multiprocessing` *spawn* child (`DagsterApiServer.StartRun`), a new interpreter that imports
Dagster, its storage, this code location and PyIceberg again before it executes a step: about
two thirds of a small run's CPU (bench/bench_run_worker.py: an Arrow entity_raw load of 10 rows,
issue 21). With the *forkserver* start method, a server process imports those modules once (the
first run of the code server starts it) and forks each run worker from itself: the worker starts
with them imported, builds its definitions from the control DB as before (nothing is built or read
in the fork server), and runs in its own process with its own instance, storage and logs, so a run
still cannot disturb the code server or another run. The fork server is single-threaded and only
imports modules (none starts a thread or opens a connection at import), which is what makes forking
it safe.

`LAKEHOUSE_RUN_WORKER_START=spawn` keeps Dagster's own spawn start (any other value but
`forkserver`, the default, is an error naming the variable). Installed by the code location in a
process that runs a code server only; a run worker or the CLI does not import the gRPC server.
"""

from __future__ import annotations

import multiprocessing

from lakehouse.settings import DagsterSettings, current

ENV = "LAKEHOUSE_RUN_WORKER_START"
#: imported once by the fork server: what every run worker imports before its first step (Dagster,
#: its SQLite storage, the code location, the PyIceberg SQL catalog); not pyspark (an Arrow run
#: never imports it, tests/test_small_run_imports.py) nor anything that starts a thread at import
PRELOAD = ("dagster", "dagster._core.storage.runs.sqlite.sqlite_run_storage",
           "dagster._core.storage.event_log.sqlite.sqlite_event_log",
           "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
           "dagster._grpc.impl", "lakehouse_assets.definitions", "lakehouse.entity_raw", "lakehouse.sources.files",
           "pyiceberg.catalog.sql")


def start_method() -> str:
    value = current(DagsterSettings).run_worker_start.strip().lower()
    if value not in ("forkserver", "spawn"):
        raise ValueError(f"{ENV}={value!r}: expected 'forkserver' (the default) or 'spawn'")
    return value


class _RunWorkerContext:
    """What `DagsterApiServer._mp_ctx` answers: the fork-server context (preloaded), or Dagster's own."""

    def __get__(self, server, owner=None):
        if server is None:
            return self
        if start_method() == "spawn" or "forkserver" not in multiprocessing.get_all_start_methods():
            return server.__dict__.get("_lakehouse_mp_ctx") or multiprocessing.get_context("spawn")
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))  # only read when the fork server starts (first run)
        return ctx

    def __set__(self, server, value) -> None:  # Dagster's __init__ sets its spawn context
        server.__dict__["_lakehouse_mp_ctx"] = value


def install() -> None:
    """Route the code server's run-worker start through `_RunWorkerContext`; once per process."""
    from dagster._grpc.server import DagsterApiServer

    if isinstance(DagsterApiServer.__dict__.get("_mp_ctx"), _RunWorkerContext):
        return
    start_method()  # a wrong value fails the code location's load, where the operator sees it
    DagsterApiServer._mp_ctx = _RunWorkerContext()
