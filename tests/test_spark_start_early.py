"""`lakehouse run` launches the JVM before the command line's own imports when the run surely
needs Spark (lakehouse.spark.start_early): decided from the control DB with sqlite3 alone. The guess
may only say yes where the run's own decision (lakehouse.engine.may_need_spark) says yes; any doubt
starts nothing. No JVM here: `warm_up` is replaced by a recorder."""

from __future__ import annotations

import atexit
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse import spark as sparkmod
from lakehouse.engine import may_need_spark
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.settings import load_settings
from tests.test_arrow_engine import META, RULES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> Path:
    """A control DB with the demo applied (once per module: applying derives its SQL stages)."""
    db = tmp_path_factory.mktemp("demo") / "control.db"
    MetadataStore(f"sqlite:///{db}").apply(load_metadata(REPO / "metadata" / "demo"))
    return db


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for name in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_SPARK_WARMUP"):
        monkeypatch.delenv(name, raising=False)
    started: list[str] = []
    monkeypatch.setattr(sparkmod, "warm_up", lambda settings: started.append(settings.catalog_name) or "thread")
    # the exit handler that kills a JVM still starting: recorded, not registered in the test process
    monkeypatch.setattr(atexit, "register", lambda fn: started.append(fn.__name__))
    return started


def _apply(tmp_path, text: str) -> MetadataStore:
    path = tmp_path / "meta.yaml"
    path.write_text(text)
    store = MetadataStore(load_settings().control_db_url)
    store.apply(load_metadata(path))
    return store


def _arrow_meta(engine: str) -> str:
    import textwrap

    return META.replace("ENGINE", engine).replace("RULES", textwrap.indent(textwrap.dedent(RULES).strip(), "      ")) + "\n"


def _demo(demo_db: Path, tmp_path: Path) -> MetadataStore:
    src, dst = sqlite3.connect(demo_db), sqlite3.connect(tmp_path / "control.db")
    with dst:
        src.backup(dst)  # the WAL's pages included
    src.close()
    dst.close()
    return MetadataStore(load_settings().control_db_url)


def test_the_demo_run_starts_its_jvm_early(home, tmp_path, demo_db):
    store = _demo(demo_db, tmp_path)
    assert may_need_spark(store.load(), "user_events_etl")  # the run itself would start one too
    assert sparkmod.start_early(["run", "user_events_etl"], load_settings) == "thread"
    assert sparkmod.start_early(["run", "-v", "user_events_etl"], load_settings) is None  # options first: left to the run
    assert home == ["release_jvm_at_exit", load_settings().catalog_name]


@pytest.mark.parametrize("engine", ["auto", "spark"])
def test_a_file_load_is_left_to_the_runs_own_decision(home, tmp_path, engine):
    store = _apply(tmp_path, _arrow_meta(engine))
    assert sparkmod.start_early(["run", "events_etl"], load_settings) is None  # no SQL stage: not sure, so no JVM here
    assert home == []
    # an `engine: spark` file load needs Spark too: the run warms it up after its imports, as before
    assert may_need_spark(store.load(), "events_etl") == (engine == "spark")


def test_no_guess_without_a_reason(home, tmp_path, monkeypatch, demo_db):
    assert sparkmod.start_early(["run", "user_events_etl"], load_settings) is None  # no control DB yet (and none created)
    assert not (tmp_path / "control.db").exists()
    _demo(demo_db, tmp_path)
    assert sparkmod.start_early(["run", "no_such_pipeline"], load_settings) is None
    assert sparkmod.start_early(["metadata", "apply", "user_events_etl"], load_settings) is None
    assert sparkmod.start_early(["run", "user_events_etl", "--help"], load_settings) is None
    assert sparkmod.start_early([], load_settings) is None
    monkeypatch.setenv("LAKEHOUSE_SPARK_WARMUP", "0")
    assert sparkmod.start_early(["run", "user_events_etl"], load_settings) is None
    monkeypatch.delenv("LAKEHOUSE_SPARK_WARMUP")
    monkeypatch.setenv("LAKEHOUSE_CONTROL_DB_URL", "postgresql://nobody@127.0.0.1:1/none")
    assert sparkmod.start_early(["run", "user_events_etl"], load_settings) is None  # another database: the run decides
    assert home == []


def test_the_command_line_starts_nothing_when_imported(home, tmp_path, demo_db):
    """Importing lakehouse.cli (tests, the Dagster layer, other programs) never starts a JVM, even
    in a process whose argv looks like `lakehouse run` (it once was keyed on argv[0]): only the
    program's entry (the console script, `python -m lakehouse`, `python -m lakehouse.cli`) guesses."""
    _demo(demo_db, tmp_path)
    code = ("import sys; sys.argv = [sys.argv[1], 'run', 'user_events_etl']; import lakehouse.cli; "
            "import lakehouse_assets.cli, lakehouse.spark as s; print(s._EARLY)")
    env = {**os.environ, "LAKEHOUSE_HOME": str(tmp_path)}
    for argv0 in (str(Path(sys.executable).with_name("lakehouse")), "x"):
        out = subprocess.run([sys.executable, "-c", code, argv0], env=env, cwd=REPO, capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip() == "{}", (argv0, out.stdout, out.stderr)


@pytest.mark.parametrize("how", ["console script", "python -m lakehouse"])
def test_the_entry_guesses_before_importing_the_command_line(home, tmp_path, demo_db, monkeypatch, how):
    """The console script's target and `python -m lakehouse` call start_early with the process's
    argv, then the command line: the installed script points at the entry, not at lakehouse.cli."""
    import runpy
    from importlib.metadata import entry_points

    import lakehouse.cli

    _demo(demo_db, tmp_path)
    monkeypatch.setattr(sys, "argv", ["lakehouse", "run", "user_events_etl"])
    monkeypatch.setattr(lakehouse.cli, "main", lambda: home.append("cli.main") or 7)
    script = entry_points(group="console_scripts", name="lakehouse")
    assert [ep.value for ep in script] == ["lakehouse._entry:main"]  # the installed one (reinstall after a change)
    if how == "console script":
        assert next(iter(script)).load()() == 7
    else:
        with pytest.raises(SystemExit) as exit_:
            runpy.run_module("lakehouse", run_name="__main__", alter_sys=False)
        assert exit_.value.code == 7
    assert home == ["release_jvm_at_exit", load_settings().catalog_name, "cli.main"]
