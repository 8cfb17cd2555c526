"""The platform's compute-log manager (lakehouse.throughput.compute_logs, configured by
deploy/dagster.dev.yaml) captures a step's stdout and stderr to Dagster's files, readable through
the instance as the UI reads them, and still mirrors them to the run's terminal, without the
`tail -F` and watcher children Dagster's local manager starts per stream (issue 21)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys
    import dagster as dg
    from dagster._core.events import DagsterEventType

    started = []
    popen_init = subprocess.Popen.__init__
    def recording(self, args, *a, **k):
        started.append([str(x) for x in (args if isinstance(args, (list, tuple)) else [args])])
        popen_init(self, args, *a, **k)
    subprocess.Popen.__init__ = recording

    @dg.op
    def talk():
        print("out-marker from the step")
        print("err-marker from the step", file=sys.stderr)
        sys.stdout.flush()
        subprocess.run(["echo", "child-marker from a child process"], check=True)  # writes fd 1 itself

    @dg.job
    def chatty():
        talk()

    instance = dg.DagsterInstance.get()
    result = chatty.execute_in_process(instance=instance)
    assert result.success
    captured = [e for e in instance.all_logs(result.run_id) if e.dagster_event
                and e.dagster_event.event_type == DagsterEventType.LOGS_CAPTURED]
    manager = instance.compute_log_manager
    logs = []
    for entry in captured:
        key = manager.build_log_key_for_run(result.run_id, entry.dagster_event.event_specific_data.file_key)
        data = manager.get_log_data(key)
        logs.append({"stdout": data.stdout.decode(), "stderr": data.stderr.decode(),
                     "complete": manager.is_capture_complete(key)})
    with open(sys.argv[1], "w") as out:
        json.dump({"manager": type(manager).__name__, "logs": logs, "started": started}, out)
""")


def test_step_output_is_captured_readable_and_mirrored_without_children(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "deploy" / "dagster.dev.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env.update(DAGSTER_HOME=str(home), LAKEHOUSE_CACHE_DIR=str(tmp_path / "cache"))
    result_file = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(result_file)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    got = json.loads(result_file.read_text())
    assert got["manager"] == "ThreadMirrorComputeLogManager"
    # read back through the instance, as the UI does: the step's lines, its child's too
    assert len(got["logs"]) == 1, got
    log = got["logs"][0]
    assert "out-marker from the step" in log["stdout"] and "child-marker from a child process" in log["stdout"]
    assert "err-marker from the step" in log["stderr"] and "out-marker" not in log["stderr"]
    assert log["complete"]
    assert list((home / "storage").rglob("*.out")), "not in Dagster's compute-log directory"
    # the terminal still sees the step's output (the mirror), each stream on its own
    assert "out-marker from the step" in proc.stdout and "child-marker from a child process" in proc.stdout
    assert "err-marker from the step" in proc.stderr
    # and no process was started for it: only the step's own `echo`
    assert got["started"] == [["echo", "child-marker from a child process"]], got["started"]
