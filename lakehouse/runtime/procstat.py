"""A process's parent, CPU and start time from Linux `/proc/<pid>/stat`: the one parser the benches
and the tests' CPU accounting share (they judge changes by CPU time on a shared machine).

Standard library only and no import from the rest of lakehouse, so a bench or a test helper can
import it without the platform (it sits in no import-linter layer). The command name is the one
field that can hold anything (spaces, parentheses: a JVM thread's "C2 CompilerThre", a process that
named itself "a) (b"): it is taken between the first "(" and the *last* ")", the numbers after it.
A zombie still has its stat file until it is reaped, with its final CPU: read it then (waitid with
WNOWAIT) to count a short-lived process in full. Elsewhere than Linux every reader returns None / [].
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcStat:
    """One line of /proc/<pid>/stat (or a thread's /proc/<pid>/task/<tid>/stat); times in seconds."""

    pid: int
    comm: str  # the kernel's command name (15 characters at most), not argv[0]
    state: str  # R running, S sleeping, Z zombie...
    ppid: int
    pgrp: int
    utime: float
    stime: float
    cutime: float  # CPU of reaped children (and what they had reaped), user
    cstime: float
    start: float  # seconds after boot the process started (CLOCK_BOOTTIME; see `start_epoch`)

    @property
    def cpu(self) -> float:
        """Own CPU: user + system."""
        return self.utime + self.stime

    @property
    def children_cpu(self) -> float:
        """CPU of the children this process has reaped (waited for): cutime + cstime."""
        return self.cutime + self.cstime

    def start_epoch(self) -> float:
        """When the process started, as `time.time()` would have said then (to a clock tick)."""
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + self.start


def parse(text: str) -> ProcStat:
    """A stat line; ValueError if it is not one."""
    try:
        left, right = text.index("("), text.rindex(")")
        f = text[right + 1:].split()
        return ProcStat(pid=int(text[:left]), comm=text[left + 1:right], state=f[0], ppid=int(f[1]), pgrp=int(f[2]),
                        utime=int(f[11]) / _TICK, stime=int(f[12]) / _TICK, cutime=int(f[13]) / _TICK,
                        cstime=int(f[14]) / _TICK, start=int(f[19]) / _TICK)
    except (IndexError, ValueError) as exc:
        raise ValueError(f"not a /proc stat line: {text[:120]!r}") from exc


def read_path(path: str) -> ProcStat | None:
    """The stat file at `path`; None if the process (or thread) is gone or the file is unreadable."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        return parse(text)
    except ValueError:
        return None


def read(pid: int, tid: int | str | None = None) -> ProcStat | None:
    """A live or zombie process (or one of its threads); None once it is gone."""
    return read_path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")


def pids() -> list[int]:
    """Every process id in /proc now."""
    try:
        return [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []


def threads(pid: int) -> list[int]:
    """The thread ids of a process ([] once it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
    except OSError:
        return []


def snapshot() -> dict[int, ProcStat]:
    """Every process readable now, by pid (processes ending meanwhile are left out)."""
    out = {}
    for pid in pids():
        st = read(pid)
        if st is not None:
            out[pid] = st
    return out


def descendants(root: int, table: dict[int, ProcStat] | None = None) -> list[int]:
    """`root` (first) and its living descendants, from `table` (default: a fresh snapshot)."""
    table = snapshot() if table is None else table
    children: dict[int, list[int]] = {}
    for st in table.values():
        children.setdefault(st.ppid, []).append(st.pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c in children.get(p, ()) if c != p)
    return out


def cmdline(pid: int) -> list[str] | None:
    """The process's argv ([] for a zombie or a kernel thread, None once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw.decode(errors="replace").rstrip("\0").split("\0") if raw else []
