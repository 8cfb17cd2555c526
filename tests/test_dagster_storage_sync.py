"""Dagster's SQLite storage under the platform's home commits without a disk flush per event (issue
21: a small `lakehouse run` waited ~1.9 s on ~130 flushes and checkpoints), bounded to that
storage's files: the platform's own databases keep SQLite's defaults, a run's events are readable
by another connection (the UI's) while it runs, and nothing is left unmerged after it."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import pytest
import sqlalchemy as sa


def _instance(home, synchronous: str | None = None):
    import dagster as dg

    extra = f"\n      synchronous: {synchronous}" if synchronous else ""
    (home / "dagster.yaml").write_text(f"""
storage:
  custom:
    module: lakehouse.throughput.dagster_storage
    class: LakehouseSqliteStorage
    config:
      base_dir: {home}{extra}
telemetry:
  enabled: false
""")
    return dg.DagsterInstance.from_config(str(home))


def _synchronous(path) -> int:
    engine = sa.create_engine(f"sqlite:///{path}", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        level = conn.execute(sa.text("PRAGMA synchronous")).scalar()
    engine.dispose()
    return level


def test_a_run_inside_keep_open_is_stored_readable_and_merged(tmp_path):
    import dagster as dg

    from lakehouse.throughput.dagster_storage import keep_open

    home = tmp_path / "dagster_home"
    home.mkdir()
    instance = _instance(home)
    seen: dict = {}

    @dg.op
    def work(context):
        context.log.info("working")
        shard = home / "history" / "runs" / f"{context.run_id}.db"
        # another process's view (the UI's): the events stored so far are there, from the WAL
        with closing(sqlite3.connect(shard)) as other:
            seen["events"] = other.execute("SELECT count(*) FROM event_logs").fetchone()[0]
        seen["wal"] = shard.with_name(shard.name + "-wal").exists()  # not checkpointed per close
        return 1

    @dg.job
    def small():
        work()

    with keep_open():
        result = small.execute_in_process(instance=instance)
        assert result.success
        # the storage's own files commit at NORMAL; a database elsewhere keeps SQLite's FULL
        assert _synchronous(home / "history" / "runs.db") == 1
        assert _synchronous(tmp_path / "control.db") == 2
    assert seen["events"] >= 3 and seen["wal"], seen
    # after the block the WAL is merged into each database and removed: no -wal file is left
    assert not list(home.rglob("*.db-wal")), list(home.rglob("*.db-wal"))
    instance.dispose()
    again = _instance(home)
    logs = again.all_logs(result.run_id)
    assert any(e.user_message == "working" for e in logs)
    assert again.get_run_by_id(result.run_id).is_success
    again.dispose()


def test_synchronous_is_configurable_and_checked(tmp_path):
    from lakehouse.throughput.dagster_storage import LakehouseSqliteStorage

    full = tmp_path / "full"
    full.mkdir()
    instance = _instance(full, "FULL")
    instance.get_runs()  # the storage's databases exist
    assert _synchronous(full / "history" / "runs.db") == 2
    instance.dispose()
    with pytest.raises(ValueError, match="synchronous: 'sometimes' is not one of OFF, NORMAL, FULL, EXTRA"):
        LakehouseSqliteStorage(str(tmp_path / "bad"), synchronous="sometimes")


def test_keep_open_reuses_one_engine_per_database(tmp_path):
    """Dagster builds an engine and opens a SQLite connection for every event and query; inside
    keep_open() each database file gets one pooled engine, so a run opens a few connections per
    file instead of dozens, and the block's end closes them all (the run stays readable)."""
    import dagster as dg
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from lakehouse.throughput import dagster_storage
    from lakehouse.throughput.dagster_storage import keep_open

    home = tmp_path / "dagster_home"
    home.mkdir()
    instance = _instance(home)
    opened: list[str] = []

    def count(dbapi_connection, _record):
        path = next(row[2] for row in dbapi_connection.execute("PRAGMA database_list") if row[1] == "main")
        if path.startswith(str(home)):
            opened.append(path)

    @dg.op
    def work(context):
        for n in range(5):
            context.log.info(f"event {n}")
        return 1

    @dg.job
    def small():
        work()

    event.listen(Engine, "connect", count)
    try:
        outside = small.execute_in_process(instance=instance)
        assert outside.success
        per_run_outside = len(opened)
        opened.clear()
        with keep_open():
            inside = small.execute_in_process(instance=instance)
            assert inside.success
            assert len(dagster_storage._engines) >= 2  # the runs database, the index, the run's shard
        per_run_inside = len(opened)
    finally:
        event.remove(Engine, "connect", count)
    assert dagster_storage._engines is None  # disposed with the block
    assert per_run_outside >= 30, per_run_outside
    assert per_run_inside <= 3 * len(set(opened)), (per_run_inside, sorted(set(opened)))
    assert per_run_inside * 4 < per_run_outside, (per_run_inside, per_run_outside)
    assert not list(home.rglob("*.db-wal")), list(home.rglob("*.db-wal"))
    instance.dispose()
    again = _instance(home)
    assert any(e.user_message == "event 4" for e in again.all_logs(inside.run_id))
    assert again.get_run_by_id(inside.run_id).is_success
    again.dispose()
