"""What `lakehouse run`'s process leaves out of its start-up (issue 21: a small run's fixed CPU),
and that the command line still reads the same.

* The cyclic garbage collector: the process's entry pauses it for a run's start-up and the run
  resumes it when its job starts (lakehouse.runtime.startup); a command line that ends before, or any
  other command, leaves it as it was.
* `python -m lakehouse.cli` is `python -m lakehouse` (it once missed the command modules, then lakehouse/cli_*.py).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse.runtime import startup

REPO = Path(__file__).resolve().parent.parent


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env["LAKEHOUSE_HOME"] = str(tmp_path)
    return env


def test_python_m_lakehouse_cli_is_the_lakehouse_command(tmp_path):
    """`python -m lakehouse.cli` (the benches' way in) offers the commands of lakehouse/cli/*.py too."""
    helps = [subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, env=_env(tmp_path),
                            capture_output=True, text=True, timeout=120) for module in ("lakehouse.cli", "lakehouse")]
    assert [h.returncode for h in helps] == [0, 0], [h.stderr for h in helps]
    assert helps[0].stdout == helps[1].stdout and "quarantine" in helps[0].stdout


@pytest.mark.parametrize("argv, paused", [(["run", "p"], True), (["-v", "run", "p"], True), (["run", "--help"], False),
                                          (["metadata", "apply", "run"], False), ([], False)])
def test_the_collector_is_paused_for_a_run_only(argv, paused):
    assert gc.isenabled()
    try:
        assert startup.pause_collector_for_run(argv) is paused
        assert gc.isenabled() is not paused
    finally:
        startup.resume_collector()
    assert gc.isenabled()
    gc.disable()  # paused by someone else: not resumed by the run
    try:
        assert startup.pause_collector_for_run(["run", "p"]) is False
        startup.resume_collector()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_run_command_line_the_parser_refuses_leaves_the_collector_on(monkeypatch, capsys):
    """The entry paused the collector; the command line ends before the run that would resume it
    (here in a caller's process, as tests call the entry): the entry resumes it."""
    from lakehouse import _entry

    monkeypatch.setattr(sys, "argv", ["lakehouse", "run"])  # no pipeline: refused, no JVM guessed
    with pytest.raises(SystemExit) as exit_:
        _entry.main()
    assert exit_.value.code == 2 and "required: pipeline" in capsys.readouterr().err
    assert gc.isenabled()
