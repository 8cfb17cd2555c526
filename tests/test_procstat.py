"""lakehouse.runtime.procstat, the one /proc/<pid>/stat reader of the benches and tests, on real processes:
this one, a child that names itself with spaces and parentheses, a zombie's final CPU, start times."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from lakehouse.runtime import procstat

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux /proc only")

TICK = 1 / os.sysconf("SC_CLK_TCK")


def test_this_process():
    t = os.times()
    me = procstat.read(os.getpid())
    assert me.pid == os.getpid() and me.ppid == os.getppid() and me.pgrp == os.getpgrp()
    assert me.state == "R"  # it is reading its own stat
    with open("/proc/self/comm") as f:
        assert me.comm == f.read().rstrip("\n")
    assert abs(me.cpu - (t.user + t.system)) <= 0.05 + 2 * TICK
    assert me.start_epoch() < time.time()
    assert procstat.read(os.getpid(), tid=os.getpid()).comm == me.comm  # the main thread's own file
    assert os.getpid() in procstat.threads(os.getpid())
    assert procstat.cmdline(os.getpid())[1:] == sys.orig_argv[1:]


def test_a_command_name_with_spaces_and_parentheses(tmp_path):
    code = "open('/proc/self/comm', 'w').write('a) (b c) d'); print('named', flush=True); input()"
    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "named\n"
        st = procstat.read(child.pid)
        assert st.comm == "a) (b c) d" and st.ppid == os.getpid() and st.state in "RS"  # on its way to input()
        assert t0 - 2 * TICK - 0.05 <= st.start_epoch() <= time.time() + 0.05  # the start time is right to a tick
        assert child.pid in procstat.descendants(os.getpid())
        # the same process as `read` sees it (its state and CPU ticks may move between two reads)
        snap, again = procstat.snapshot()[child.pid], procstat.read(child.pid)
        assert (snap.pid, snap.comm, snap.ppid, snap.pgrp, snap.start) == (again.pid, again.comm, again.ppid,
                                                                           again.pgrp, again.start)
        assert procstat.cmdline(child.pid) == [sys.executable, "-c", code]
    finally:
        child.communicate("\n", timeout=30)
    assert procstat.read(child.pid) is None and procstat.cmdline(child.pid) is None  # reaped: gone
    with pytest.raises(ValueError, match="not a /proc stat line"):
        procstat.parse("12 (x) R")


def test_a_zombies_final_cpu_is_what_reaping_it_adds():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.4: pass"])
    info = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
    assert info.si_pid == child.pid
    zombie = procstat.read(child.pid)
    assert zombie.state == "Z" and procstat.cmdline(child.pid) == []
    assert zombie.cpu >= 0.4 - TICK
    child.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert abs(reaped - zombie.cpu) <= 2 * TICK  # the kernel's rusage is finer than the ticks
    assert procstat.read(os.getpid()).children_cpu >= zombie.cpu - TICK
