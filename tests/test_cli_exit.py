"""`lakehouse` as a process ends without the interpreter's module teardown (lakehouse.cli.
exit_without_teardown): what a normal exit guarantees must still hold — every exit handler runs,
the output is flushed to a pipe, the exit code is the command's, a non-daemon thread is waited for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses of the platform

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from lakehouse import cli
    atexit.register(lambda: print("exit handler ran", flush=False))
    def late():
        time.sleep(0.5)
        sys.stdout.write("thread finished\\n")
    threading.Thread(target=late).start()
    sys.argv = ["lakehouse", *sys.argv[1:]]
    cli.main()
    print("never printed: main ends the process")
""")


def _run(tmp_path, *args):
    env = {**os.environ, "LAKEHOUSE_HOME": str(tmp_path)}
    env.pop("LAKEHOUSE_CONTROL_DB_URL", None)
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_command_ends_with_its_code_its_output_and_every_exit_handler(tmp_path):
    ok = _run(tmp_path, "metadata", "validate", str(REPO / "metadata" / "demo"))
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert len(lines) == 3 and lines[-1] == "exit handler ran", ok.stdout  # threads end before exit handlers run
    assert "thread finished" in lines
    assert any(line.startswith(f"{REPO / 'metadata' / 'demo'}: valid (1 pipelines") for line in lines), ok.stdout

    bad = _run(tmp_path, "stage", "disable", "no_such_pipeline", "x")
    assert bad.returncode == 2, (bad.stdout, bad.stderr)
    assert "no_such_pipeline" in bad.stderr
    assert bad.stdout.splitlines() == ["thread finished", "exit handler ran"], bad.stdout
