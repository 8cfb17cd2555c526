"""What `lakehouse run`'s process leaves out of its start-up (issue 21: a small run's fixed CPU),
and that every other command line reads as before.

* The parser: `run` (an entry-point command) is parsed by a parser of the entry points' commands
  only, without importing the `lakehouse/cli_*.py` modules; what it refuses, help and every other
  command go to the full parser (lakehouse.cli.parse_args).
* The cyclic garbage collector: the process's entry pauses it for a run's start-up and the run
  resumes it when its job starts (lakehouse.startup); a command line that ends before, or any
  other command, leaves it as it was.
* `python -m lakehouse.cli` is `python -m lakehouse` (it once missed the cli_*.py commands).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lakehouse import cli, startup

REPO = Path(__file__).resolve().parent.parent


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env["LAKEHOUSE_HOME"] = str(tmp_path)
    return env


def test_a_run_command_line_is_parsed_without_the_cli_modules(tmp_path):
    """In a fresh process (as `lakehouse run` starts): no lakehouse/cli_*.py module is imported to
    parse it, and the result is the full parser's."""
    code = textwrap.dedent("""
        import json, sys
        from lakehouse import cli
        argvs = [["run", "p"], ["-v", "run", "p", "--ephemeral"], ["run", "-v", "p"]]
        slim = [vars(cli.parse_args(a)) for a in argvs]
        imported = sorted(m for m in sys.modules if m.startswith("lakehouse.cli_"))
        cli._load_extra_commands()
        full = [vars(cli.build_parser().parse_args(a)) for a in argvs]
        out = lambda ns: {k: getattr(v, "__qualname__", v) for k, v in ns.items()}
        print(json.dumps([imported, [out(n) for n in slim], [out(n) for n in full],
                          sorted(m for m in sys.modules if m.startswith("lakehouse.cli_"))]))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    imported, slim, full, later = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], f"parsing `lakehouse run` imported {imported}"
    assert later, "the guard can fail: the full parser imports the cli_*.py modules"
    assert slim == full
    assert slim[0] == {"command": "run", "verbose": False, "pipeline": "p", "ephemeral": False, "func": "cmd_run"}
    assert slim[1]["verbose"] is True and slim[1]["ephemeral"] is True and slim[2]["verbose"] is True


@pytest.mark.parametrize("argv", [["run", "p", "--bogus"], ["run"], ["runx"], ["run", "--help"], ["--help"],
                                  ["metadata", "--help"]])
def test_errors_and_help_read_as_the_full_parsers(argv, capsys):
    def full(args):
        cli._load_extra_commands()
        return cli.build_parser().parse_args(args)

    outputs = []
    for parse in (cli.parse_args, full):
        with pytest.raises(SystemExit) as exit_:
            parse(argv)
        outputs.append((exit_.value.code, *capsys.readouterr()))
    assert outputs[0] == outputs[1]
    code, out, err = outputs[0]
    assert code == (0 if "--help" in argv else 2)
    if argv in (["run", "p", "--bogus"], ["runx"], ["--help"]):  # the top parser's usage: every command
        assert "quarantine" in out + err


def test_python_m_lakehouse_cli_is_the_lakehouse_command(tmp_path):
    """`python -m lakehouse.cli` (the benches' way in) offers the cli_*.py commands too."""
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
