"""Several processes opening one fresh Dagster instance (the platform's SQLite storage) at once.

Dagster's SQLite run and schedule storages create their tables and stamp Alembic with no lock, so
two processes opening a new `$LAKEHOUSE_HOME/dagster_home` together — two first `lakehouse run`s,
a run beside `dagster dev`, the daemon and a client — failed with "table runs already exists",
"UNIQUE constraint failed: alembic_version.version_num" or "alembic_version has more than one
head" (seen in tests/test_scale_runworker.py on a loaded machine; before the fix every round
here failed). Here four processes, released by a barrier, open each of two fresh instances made
from `deploy/dagster.dev.yaml`: every open must succeed, every database must carry one Alembic
revision, and the instance must work (a run stored by one process is read by another).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from lakehouse.orchestration.instance import TEMPLATE

pytestmark = pytest.mark.slow  # forks processes that initialise Dagster storage

PROCESSES, ROUNDS = 4, 2


def _open(home: str, barrier, results) -> None:
    try:
        import dagster as dg

        import lakehouse.compat.dagster  # noqa: F401 - the template's storage class

        barrier.wait(timeout=60)
        os.environ["DAGSTER_HOME"] = home
        inst = dg.DagsterInstance.get()
        run = inst.create_run_for_job(dg.GraphDefinition("g").to_job("j" + str(os.getpid())))
        inst.dispose()
        results.put(run.run_id)
    except BaseException as exc:  # reported to the test, which names it
        results.put(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def test_processes_opening_a_fresh_instance_at_once_all_succeed(tmp_path, monkeypatch):
    import dagster  # noqa: F401 - imported before the fork, so the children start at once

    import lakehouse.compat.dagster  # noqa: F401

    ctx = mp.get_context("fork")
    for r in range(ROUNDS):
        home = tmp_path / f"dagster_home_{r}"
        home.mkdir()
        shutil.copyfile(TEMPLATE, home / "dagster.yaml")
        barrier, results = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [ctx.Process(target=_open, args=(str(home), barrier, results)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        out = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        errors = [x for x in out if len(x) != 36]  # a run id, or the error a process hit
        assert not errors, f"round {r}: {errors}"

        for db in (home / "history" / "runs.db", home / "schedules" / "schedules.db",
                   home / "history" / "runs" / "index.db"):
            with sqlite3.connect(db) as conn:
                assert len(conn.execute("SELECT version_num FROM alembic_version").fetchall()) == 1, db
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        import dagster as dg

        with dg.DagsterInstance.get() as inst:
            assert {run.run_id for run in inst.get_runs()} == set(out)
        assert Path(home / ".storage-initialised").exists()


def test_a_home_made_from_an_older_template_is_made_again_and_the_old_file_kept(tmp_path, monkeypatch):
    """A dagster.yaml written before the platform stopped replacing Dagster's storage and compute logs
    names modules that no longer exist: the default home is made again from the current template,
    the old file kept beside it, and the instance opens."""
    from lakehouse.orchestration.instance import ensure_home
    from lakehouse.settings import load_settings

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    home = tmp_path / "dagster_home"
    home.mkdir()
    old = ("storage:\n  custom:\n    module: lakehouse.throughput.dagster_storage\n    class: LakehouseSqliteStorage\n"
           f"    config:\n      base_dir: {home}\ncompute_logs:\n  module: lakehouse.throughput.compute_logs\n"
           "  class: ThreadMirrorComputeLogManager\n")
    (home / "dagster.yaml").write_text(old)
    assert ensure_home(load_settings()) == home
    text = (home / "dagster.yaml").read_text()
    assert "lakehouse.compat.dagster" in text and "lakehouse.throughput" not in text
    assert (home / "dagster.yaml.bak").read_text() == old
