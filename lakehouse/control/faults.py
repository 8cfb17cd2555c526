"""The one fault-injection hook, for tests and drills: every switch is an environment variable read
here and nowhere else, and production code has one call per injection point, `inject(point, ...)`,
which with none of them set returns after one dictionary lookup per variable.

Faults by spec, `LAKEHOUSE_FAULTS="commit_conflict:times=1;oom:rows_above=500;source_down:source=orders_raw"`
(each fires at one named point of a stage; `times=N` limits it to the first N hits per run):

* `commit_conflict` (point publish): commit an empty snapshot to main (a real concurrent commit),
  then commit on the table metadata read before it, which Iceberg refuses with its own
  CommitFailedException;
* `oom` (point batch): raise an out-of-memory error when a batch has more than `rows_above` rows;
* `source_down` (point extract): the stage's source `source` is unreachable;
* `hang` (point batch): a Spark job that never finishes (a task sleeping `seconds`, default an
  hour, inside the JVM), what the step's deadline must cancel;
* `fail` (point `point`, default extract): raise `message` (default a transient I/O error);
* `sleep` (point `point`, default extract): hold the step for `seconds` (a slow source: pool drills).

Injected errors are the platform's own classes (`SourceUnavailable`, `TransientIO`), or
`lakehouse.errors.InjectedFault` carrying the code of the fault it plays, so they are classified,
healed and retried like the real one.

Process faults at named points (`before_batch`, `after_branch_commit`, `before_publish`,
`between_publishes`, `after_publish`, `download`, ...):

* `LAKEHOUSE_CRASH_AT=<point>` (or `<point>@<stage_name>`: there in that stage only, for points
  given the stage) stops the process there: with `LAKEHOUSE_CRASH_MARKER=<file>` it
  writes the file and waits to be killed from outside (the test's kill -9); without it, it
  SIGKILLs itself;
* `LAKEHOUSE_PAUSE_AT=<point>[,<point>...]` (a point may be `<point>@<stage_name>`, as above) with `LAKEHOUSE_PAUSE_DIR=<dir>` writes
  `<dir>/<point>.<pid>` the first time the process gets there and waits until `<dir>/release` or
  `<dir>/release.<point>` exists (tests line concurrent runs up at one point, or stop a database
  while a run is there); `LAKEHOUSE_PAUSE_SECONDS` bounds the wait (default 600);
* `LAKEHOUSE_FAULT_AFTER_JDBC_READ=<source id>|*` (point after_jdbc_read): raise after the JDBC
  source was read and before the Iceberg commit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.errors import ICEBERG_COMMIT_CONFLICT, OUT_OF_MEMORY, InjectedFault, SourceUnavailable, TransientIO
from lakehouse.settings import FaultHooks, current

ENV = "LAKEHOUSE_FAULTS"
CRASH_AT_ENV = "LAKEHOUSE_CRASH_AT"
CRASH_MARKER_ENV = "LAKEHOUSE_CRASH_MARKER"
PAUSE_AT_ENV = "LAKEHOUSE_PAUSE_AT"
PAUSE_DIR_ENV = "LAKEHOUSE_PAUSE_DIR"
PAUSE_SECONDS_ENV = "LAKEHOUSE_PAUSE_SECONDS"
AFTER_JDBC_READ_ENV = "LAKEHOUSE_FAULT_AFTER_JDBC_READ"

_HITS: Counter = Counter()
_LOCK = threading.Lock()

POINTS = {"commit_conflict": "publish", "oom": "batch", "source_down": "extract", "hang": "batch"}
FREE_POINT = ("fail", "sleep")  # faults whose point is an option (default extract)


def parse(spec: str | None) -> list[tuple[str, dict[str, str]]]:
    """'name:k=v,k=v;name2' -> [(name, {k: v})]; unknown names are errors, not silent no-ops."""
    out = []
    for part in (spec or "").split(";"):
        part = part.strip()
        if not part:
            continue
        name, _, rest = part.partition(":")
        name = name.strip()
        if name not in (*POINTS, *FREE_POINT):
            raise ValueError(f"{ENV}: unknown fault {name!r}; known: {sorted((*POINTS, *FREE_POINT))}")
        opts = {}
        for kv in filter(None, (x.strip() for x in rest.split(","))):
            k, sep, v = kv.partition("=")
            if not sep:
                raise ValueError(f"{ENV}: option {kv!r} of fault {name!r} is not key=value")
            opts[k.strip()] = v.strip()
        out.append((name, opts))
    return out


def active() -> list[tuple[str, dict[str, str]]]:
    return parse(current(FaultHooks).faults)


def _take(name: str, opts: dict[str, str], run_id: str) -> bool:
    """Count a hit; False once the fault has fired `times` times in this run."""
    limit = int(opts.get("times", "0") or 0)
    with _LOCK:
        key = (name, opts.get("point", ""), run_id)
        if limit and _HITS[key] >= limit:
            return False
        _HITS[key] += 1
    return True


def inject(point: str, runner: Any = None, **ctx: Any) -> None:
    """Play the fault the environment asks for at this point, if any (see the module docstring)."""
    hooks = current(FaultHooks)  # the test hooks, read where they apply (lakehouse.settings.FaultHooks)
    if not hooks.any:
        return
    if hooks.pause_at and hooks.pause_dir:
        wanted = hooks.pause_at.split(",")
        for name in (point, _at_stage(point, runner)):
            if name in wanted:
                _pause(name, hooks.pause_dir, hooks.pause_seconds)
    crash_at = hooks.crash_at
    if crash_at and crash_at in (point, _at_stage(point, runner)):
        _crash(point, hooks.crash_marker)
    if point == "after_jdbc_read" and hooks.fault_after_jdbc_read in (ctx.get("source_id"), "*"):
        ctx["df"].count()  # the read has happened...
        raise InjectedFault(f"injected fault after reading source {ctx.get('source_id')!r} "
                            f"(unset {AFTER_JDBC_READ_ENV})")
    if hooks.faults:
        _spec_faults(point, runner, ctx)


def _at_stage(point: str, runner: Any) -> str | None:
    """`point@stage_name`: the point in one stage only (a crash between two stages' commits)."""
    stage = getattr(runner, "stage", None)
    return f"{point}@{stage.stage_name}" if stage is not None else None


def _crash(point: str, marker: str | None) -> None:
    if marker:
        with open(marker, "w") as fh:
            fh.write(f"{os.getpid()} {point}\n")
        time.sleep(600)
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(point: str, folder: str, max_wait_s: float) -> None:
    d = Path(folder)
    marker = d / f"{point}.{os.getpid()}"
    if marker.exists():
        return  # once per point and process
    marker.write_text(f"{os.getpid()} {point}\n")
    deadline = time.monotonic() + max_wait_s
    while not ((d / "release").exists() or (d / f"release.{point}").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)


def _spec_faults(point: str, runner: Any, ctx: dict[str, Any]) -> None:
    run_id = getattr(runner, "run_id", "") or ""
    for name, opts in active():
        where = opts.get("point", "extract") if name in FREE_POINT else POINTS[name]
        if where != point:
            continue
        if "stage" in opts and runner is not None and opts["stage"] != runner.stage.stage_name:
            continue
        if name == "source_down":
            if opts.get("source") and opts["source"] != ctx.get("source_id"):
                continue
            if _take(name, opts, run_id):
                raise SourceUnavailable(f"source {ctx.get('source_id')!r} is unavailable: Connection refused "
                                        f"(injected by {ENV})")
        elif name == "oom":
            df = ctx.get("df")
            limit = int(opts.get("rows_above", "0"))
            if df is not None and df.count() > limit and _take(name, opts, run_id):
                raise InjectedFault(f"java.lang.OutOfMemoryError: Java heap space (injected by {ENV}: "
                                    f"batch above {limit} rows)", OUT_OF_MEMORY)
        elif name == "commit_conflict":
            if _take(name, opts, run_id):
                _stale_commit(runner)
        elif name == "sleep":
            if _take(name, opts, run_id):
                time.sleep(float(opts.get("seconds", "5")))
        elif name == "hang":
            if _take(name, opts, run_id):
                ms = int(float(opts.get("seconds", "3600")) * 1000)
                # Thread.sleep in an executor task: a job that only a cancellation ends
                runner.platform.spark().range(1).selectExpr(
                    f"reflect('java.lang.Thread', 'sleep', CAST({ms} AS BIGINT)) AS slept").collect()
        elif name == "fail":
            if _take(name, opts, run_id):
                raise TransientIO(opts.get("message", f"503 Service Unavailable (injected by {ENV} at {point})"))


def _stale_commit(runner: Any) -> None:
    """Another writer commits to main (an empty append: main moves, no rows change), then a commit
    on the table metadata read before it: Iceberg itself refuses that one with a real
    CommitFailedException, raised here through Py4J as from any other commit."""
    tables = runner.platform.tables()
    ident = runner.target.identifier
    ops = tables.java_table(ident).operations()
    stale = ops.current()
    tables.spark.table(tables.qualified(ident)).limit(0).writeTo(tables.qualified(ident)).append()
    props = pyspark_compat.jvm(tables.spark).java.util.HashMap()
    props.put("lakehouse.injected_fault", "commit_conflict")
    ops.commit(stale, stale.replaceProperties(props))
    raise InjectedFault(f"the stale commit on {ident} was not refused (injected by {ENV})", ICEBERG_COMMIT_CONFLICT)


def hits(name: str, run_id: str) -> int:
    """How often fault `name` fired in run `run_id`: the attempts a step made, for tests that count them."""
    with _LOCK:
        return sum(n for (fault, _point, run), n in _HITS.items() if fault == name and run == run_id)


def reset() -> None:
    with _LOCK:
        _HITS.clear()
