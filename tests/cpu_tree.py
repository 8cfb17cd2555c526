"""CPU time of a command's whole process tree, for judging test-suite changes on a shared machine.

    python -m tests.cpu_tree .venv/bin/python -m pytest -m slow tests/test_outage.py -p no:cacheprovider

Wall time on the 2-core machine moves with everyone else's load; CPU time much less. This runs the
command as a child subreaper (Linux), so descendants whose parent exits first — a `lakehouse run`'s
JVM, a daemon's run workers — are reaped here and their CPU counted, which `time` misses. It also
samples /proc every half second for a rough split by kind of process (the last half second of each
process is not seen). Prints to stderr: wall, tree CPU, the load average before and after.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import threading
import time
from collections import defaultdict

from lakehouse.runtime import procstat

KINDS = ("java", "dagster-daemon", "dagster-webserver", "dagster dev", "api grpc", "execute_run", "lakehouse.cli",
         "bin/lakehouse", "pytest", "postgres", "moto", "chrom")


def _kind(argv: list[str]) -> str:
    if argv and os.path.basename(argv[0]) == "java":
        return "java"
    line = " ".join(argv)
    return next((k for k in KINDS if k in line), os.path.basename(argv[0]) if argv and argv[0] else "other")


def _sample(root: int, seen: dict[int, tuple[str, float]], stop: threading.Event) -> None:
    while not stop.is_set():
        table = procstat.snapshot()
        parent = {pid: st.ppid for pid, st in table.items()}
        for pid in parent:
            p, hops = pid, 0
            while p in parent and p != root and hops < 40:
                p, hops = parent[p], hops + 1
            if p == root and pid != root:
                argv = procstat.cmdline(pid)
                if argv is None:
                    continue
                kind = _kind(argv) if argv else seen.get(pid, ("other", 0.0))[0]  # a zombie's is empty
                seen[pid] = (kind, table[pid].cpu)
        time.sleep(0.5)


def main(argv: list[str]) -> int:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    load0, t0 = os.getloadavg()[0], time.monotonic()
    seen: dict[int, tuple[str, float]] = {}
    stop = threading.Event()
    threading.Thread(target=_sample, args=(os.getpid(), seen, stop), daemon=True).start()
    child = subprocess.Popen(argv)
    rc = 1
    while True:  # reap the command and every orphan handed to us, until none is left
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child.pid:
            rc = os.waitstatus_to_exitcode(status)
    stop.set()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for kind, cpu in seen.values():
        by_kind[kind][0] += cpu
        by_kind[kind][1] += 1
    print(f"cpu_tree: rc={rc} wall={time.monotonic() - t0:.1f}s cpu={ru.ru_utime + ru.ru_stime:.1f}s "
          f"(user {ru.ru_utime:.1f}, sys {ru.ru_stime:.1f}) load {load0:.2f}->{os.getloadavg()[0]:.2f}\n"
          "cpu_tree: sampled by kind: " + ", ".join(f"{k} {c:.1f}s/{n}" for k, (c, n) in
                                                  sorted(by_kind.items(), key=lambda x: -x[1][0])), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
