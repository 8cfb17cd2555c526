"""Fault injection for tests and drills: OFF unless the environment variable LAKEHOUSE_FAULTS is set.

    LAKEHOUSE_FAULTS="commit_conflict:times=1;oom:rows_above=500;source_down:source=orders_raw"

Faults (each fires at one named point of a stage; `times=N` limits it to the first N hits per run):

* `commit_conflict` (point publish): commit an empty snapshot to main (a real concurrent commit),
  then raise the text of Iceberg's CommitFailedException;
* `oom` (point batch): raise a java.lang.OutOfMemoryError-like error when a batch has more than
  `rows_above` rows;
* `source_down` (point extract): the stage's source `source` is unreachable;
* `hang` (point batch): a Spark job that never finishes (a task sleeping `seconds`, default an
  hour, inside the JVM), what the step's deadline must cancel;
* `fail` (point `point`, default extract): raise `message` (default a transient I/O error);
* `sleep` (point `point`, default extract): hold the step for `seconds` (a slow source: pool drills).

Production code calls `inject(point, ...)`; with the variable unset that is one dict lookup.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

ENV = "LAKEHOUSE_FAULTS"
_HITS: Counter = Counter()
_LOCK = threading.Lock()

POINTS = {"commit_conflict": "publish", "oom": "batch", "source_down": "extract", "hang": "batch"}
FREE_POINT = ("fail", "sleep")  # faults whose point is an option (default extract)


class InjectedFault(RuntimeError):
    """Base of injected faults, so a drill's errors are recognisable in logs."""


class InjectedCommitFailed(InjectedFault):
    pass


class InjectedOutOfMemory(InjectedFault):
    pass


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
    return parse(os.environ.get(ENV))


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
    """Raise the configured fault for this point, if any. No-op when LAKEHOUSE_FAULTS is unset."""
    if not os.environ.get(ENV):
        return
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
                from lakehouse.errors import SourceUnavailable

                raise SourceUnavailable(f"source {ctx.get('source_id')!r} is unavailable: Connection refused "
                                        f"(injected by {ENV})")
        elif name == "oom":
            df = ctx.get("df")
            limit = int(opts.get("rows_above", "0"))
            if df is not None and df.count() > limit and _take(name, opts, run_id):
                raise InjectedOutOfMemory(f"java.lang.OutOfMemoryError: Java heap space (injected by {ENV}: "
                                          f"batch above {limit} rows)")
        elif name == "commit_conflict":
            if _take(name, opts, run_id):
                _concurrent_commit(runner)
                raise InjectedCommitFailed(
                    "org.apache.iceberg.exceptions.CommitFailedException: Cannot commit changes based on stale "
                    f"table metadata: main of {runner.target.identifier} changed (injected by {ENV})")
        elif name == "sleep":
            if _take(name, opts, run_id):
                import time

                time.sleep(float(opts.get("seconds", "5")))
        elif name == "hang":
            if _take(name, opts, run_id):
                ms = int(float(opts.get("seconds", "3600")) * 1000)
                # Thread.sleep in an executor task: a job that only a cancellation ends
                runner.platform.spark().range(1).selectExpr(
                    f"reflect('java.lang.Thread', 'sleep', CAST({ms} AS BIGINT)) AS slept").collect()
        elif name == "fail":
            if _take(name, opts, run_id):
                from lakehouse.errors import TransientIO

                raise TransientIO(opts.get("message", f"503 Service Unavailable (injected by {ENV} at {point})"))


def _concurrent_commit(runner: Any) -> None:
    """Another writer commits to main: an empty append, so main moves but no rows change."""
    if runner is None:
        return
    tables = runner.platform.tables()
    ident = runner.target.identifier
    tables.spark.table(tables.qualified(ident)).limit(0).writeTo(tables.qualified(ident)).append()


def reset() -> None:
    with _LOCK:
        _HITS.clear()
