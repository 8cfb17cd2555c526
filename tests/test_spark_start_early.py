"""`lakehouse run` launches the JVM before the command line's own imports when the run surely
needs Spark (lakehouse.runtime.spark.start_early): decided from the control DB with sqlite3 alone. The guess
may only say yes where the run's own decision (lakehouse.engines.choice.may_need_spark) says yes; any doubt
starts nothing. No JVM here: `warm_up` is replaced by a recorder."""

from __future__ import annotations

import atexit
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lakehouse.engines.choice import may_need_spark
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.runtime import spark as sparkmod
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
            "import lakehouse_assets.cli, lakehouse.runtime.spark as s; print(s._EARLY)")
    env = {**os.environ, "LAKEHOUSE_HOME": str(tmp_path)}
    for argv0 in (str(Path(sys.executable).with_name("lakehouse")), "x"):
        out = subprocess.run([sys.executable, "-c", code, argv0], env=env, cwd=REPO, capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip() == "{}", (argv0, out.stdout, out.stderr)


def test_only_the_program_imports_the_entry():
    """The entry launches a JVM when called, so no module imports it but `python -m lakehouse`'s."""
    import grimp

    graph = grimp.build_graph("lakehouse", "lakehouse_assets", "resources", "sensors", "schedules", cache_dir=None)
    assert graph.find_modules_that_directly_import("lakehouse._entry") == {"lakehouse.__main__"}


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


def test_python_m_lakehouse_cli_guesses_too(home, tmp_path, demo_db, monkeypatch):
    """`python -m lakehouse.cli run ...` (the benches' and the concurrency kit's way in) launches
    early from cli.py's `__main__` branch, before the command line parses its arguments (here
    an option it refuses, so nothing runs)."""
    import runpy
    import warnings

    _demo(demo_db, tmp_path)
    monkeypatch.setattr(sys, "argv", ["lakehouse.cli", "run", "user_events_etl", "--no-such-option"])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exit_:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: lakehouse.cli is imported already
        runpy.run_module("lakehouse.cli", run_name="__main__", alter_sys=False)
    assert exit_.value.code == 2
    assert home == ["release_jvm_at_exit", load_settings().catalog_name]


E2E_META = """
pipelines:
  - {pipeline_id: early_sql}
  - {pipeline_id: early_arrow}
sources:
  - {source_id: early_events, kind: files, format: jsonl, path: events, glob: "*.jsonl"}
targets:
  - {target_id: early_sql_t, namespace: silver, table: early_sql, write_mode: append}
  - {target_id: early_arrow_t, namespace: bronze, table: early_arrow, engine: arrow}
stages:
  - {pipeline_id: early_sql, stage_order: 1, stage_name: make, layer: silver, target_id: early_sql_t,
     transformation: "SELECT 1 AS id, 'a' AS kind"}
  - {pipeline_id: early_arrow, stage_order: 1, stage_name: ingest, layer: bronze, source_id: early_events,
     target_id: early_arrow_t}
"""


def _run_watching_spark(env: dict[str, str], cwd: Path, *args: str) -> tuple[int, str, dict[int, float], set[str]]:
    """`lakehouse <args>` through the installed console script, its process tree sampled every 50 ms:
    (exit code, output, {pid: start time (epoch)} of the Spark JVMs it launched, every command
    name seen in its tree). The JVM is the child PySpark starts as `spark-submit`, exec'd into
    java SparkSubmit under the same pid: its start time is when PySpark launched it."""
    import threading
    import time

    from lakehouse.runtime import procstat
    from tests.fixtures.dagster_dev import VENV_BIN

    proc = subprocess.Popen([str(VENV_BIN / "lakehouse"), *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    spark: dict[int, float] = {}
    comms: set[str] = set()
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        table = procstat.snapshot()
        for pid in procstat.descendants(proc.pid, table)[1:]:
            if pid not in table:
                continue
            comms.add(table[pid].comm)
            argv = " ".join(procstat.cmdline(pid) or ())
            if table[pid].ppid == proc.pid and ("SparkSubmit" in argv or "spark-submit" in argv):
                spark.setdefault(pid, table[pid].start_epoch())
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    reader.join(30)
    return proc.returncode, "".join(out), spark, comms


@pytest.mark.slow
def test_a_real_lakehouse_run_launches_its_jvm_before_the_command_lines_imports(tmp_path):
    """`lakehouse run` of a pipeline with a SQL stage, as a real process: its one JVM was launched
    before the process began importing the `run` command's module (lakehouse_assets.cli, loaded by
    lakehouse.cli.main once lakehouse.cli's own imports are done; without the early launch the run
    starts its JVM later, from that module's cmd_run). The marker is that module's bytecode file,
    written under a fresh PYTHONPYCACHEPREFIX when the process compiled it, just before running it.
    And an Arrow-only pipeline's `lakehouse run` starts no JVM at all."""
    import importlib.util

    from lakehouse.metadata.loader import load_metadata
    from lakehouse.metadata.store import MetadataStore
    from tests.fixtures.dagster_dev import platform_env

    home = tmp_path / "home"
    (home / "landing" / "events").mkdir(parents=True)
    (home / "landing" / "events" / "a.jsonl").write_text('{"id": 1, "kind": "a"}\n{"id": 2, "kind": "b"}\n')
    (tmp_path / "meta.yaml").write_text(E2E_META)
    MetadataStore(f"sqlite:///{home / 'control.db'}").apply(load_metadata(tmp_path / "meta.yaml"))
    pycache = tmp_path / "pycache"
    env = platform_env(home, PYTHONPYCACHEPREFIX=str(pycache), LAKEHOUSE_DATAHUB="off")
    env.pop("LAKEHOUSE_METADATA_DIR", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the marker is a bytecode file the run writes

    code, out, spark, _ = _run_watching_spark(env, tmp_path, "run", "early_sql")
    assert code == 0, out
    assert len(spark) == 1, (spark, out)  # the early JVM is the run's: no second launch
    source = importlib.import_module("lakehouse_assets.cli").__file__
    # PYTHONPYCACHEPREFIX mirrors the source's directory: <prefix>/<its absolute path>/cli.<tag>.pyc
    marker = pycache / Path(source).parent.relative_to("/") / Path(importlib.util.cache_from_source(source)).name
    assert marker.is_file(), sorted(str(p) for p in pycache.rglob("cli.*.pyc"))
    jvm_start, imported = next(iter(spark.values())), marker.stat().st_mtime
    assert jvm_start < imported, (f"the JVM was launched {jvm_start - imported:.2f} s after the run began importing "
                                  "lakehouse_assets.cli: not before lakehouse.cli's imports (lakehouse._entry)")

    code, out, spark, comms = _run_watching_spark(env, tmp_path, "run", "early_arrow")
    assert code == 0, out
    assert "bronze/early_arrow  published" in out and spark == {} and "java" not in comms, (spark, comms, out)


def test_the_exit_handler_finds_only_its_own_spark_submit_children():
    """release_jvm_at_exit kills what `_own_spark_children` names: this process's children whose
    command line runs SparkSubmit, never another child or another process's JVM."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    jvm_like = subprocess.Popen([*sleeper, "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"])
    other = subprocess.Popen(sleeper)
    try:
        found = sparkmod._own_spark_children()
        assert jvm_like.pid in found
        assert other.pid not in found
    finally:
        for p in (jvm_like, other):
            p.kill()
            p.wait()
