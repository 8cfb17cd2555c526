"""What the `lakehouse` process decides from its command line before importing anything else.

`command_of` names the command. `lakehouse run` is the one whose start-up is paid per run (issue
21), and its cyclic garbage collector is decided from it (`pause_collector_for_run` /
`resume_collector`): such a process imports ~2,000 modules (Dagster, SQLAlchemy, PyIceberg, pydantic
models) and builds one pipeline's definitions before its job starts, ~200,000 container objects that
nearly all live until the process ends, and the collector traverses them again and again while they
arrive (~500 young and 3 full collections: ~0.2 s of CPU, a tenth of a small Arrow run). The entry
pauses it for a run; the run freezes what is alive when its job starts (`gc.freeze`) and resumes it
(lakehouse_assets/cli.py): the pattern the `gc.freeze` documentation gives for a process that freezes
what it holds. The job's own garbage is collected as before; the cyclic garbage of the start-up
(~5,000 objects, e.g. the parser and the SQLAlchemy engines Dagster builds per call) is frozen with it
instead of freed: a few MB, in a process that ends with the run.

Standard library only, and nothing of lakehouse: the entry (lakehouse._entry) imports it first.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

#: the options `lakehouse` takes before its command (lakehouse.cli.build_parser)
GLOBAL_FLAGS = ("-v", "--verbose")

_paused = False


def command_of(argv: list[str]) -> str | None:
    """The command `argv` names (`run`, `metadata`, ...), or None when it asks for help or names none."""
    if "-h" in argv or "--help" in argv:
        return None
    rest = [a for a in argv if a not in GLOBAL_FLAGS]
    return rest[0] if rest and not rest[0].startswith("-") else None


def pause_collector_for_run(argv: list[str]) -> bool:
    """Pause the cyclic garbage collector if `argv` is a `lakehouse run` (only the process's own
    entry may: the run resumes it when its job starts). Whether it is paused now."""
    global _paused
    if command_of(argv) == "run" and gc.isenabled():
        gc.disable()
        _paused = True
    return _paused


def resume_collector() -> None:
    """Resume the collector if `pause_collector_for_run` paused it (and nothing else did)."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()


# --------------------------------------------------------------------------- ending the process

_exit_code: int | None = None
_armed = False


def arm_fast_exit() -> None:
    """Register the exit handler that ends the process once every other exit handler has run (see
    `end_after_exit_handlers`). Exit handlers run last-registered first, so this one is registered
    as early as possible: when the `lakehouse` package is imported (lakehouse/__init__.py). It does
    nothing unless the command line asked for it."""
    global _armed
    if not _armed:
        atexit.register(_end_process)
        _armed = True


def end_after_exit_handlers(code: int) -> None:
    """End the process with `code` as a normal exit does — non-daemon threads are waited for and
    every exit handler runs (logging, Dagster, SQLAlchemy, temporary files) — minus the interpreter's
    module teardown: the last exit handler flushes the streams and calls `os._exit`. With Dagster,
    PyIceberg, boto3 and PySpark loaded, the teardown alone costs ~1 s of CPU and 2-3 s of wall time
    per command (bench/bench_demo.py), and everything it would do is gone with the process anyway
    (committed work is durable). Public APIs only: `sys.exit` (threads, then exit handlers), and
    `os._exit`, documented in the Python library reference as the way to exit without cleanup."""
    global _exit_code
    _exit_code = code if _armed else None  # not armed: the full interpreter shutdown, as before
    sys.exit(code)


def _end_process() -> None:
    if _exit_code is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe, no stream: nothing more can be said
            pass
    os._exit(_exit_code)
