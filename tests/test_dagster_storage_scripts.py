"""The platform's Dagster SQLite storage reads Dagster's Alembic scripts once per process (issue 21:
each `lakehouse run` checked four databases, loading every migration script each time), and a
database behind the scripts' head is still reported as behind."""

from __future__ import annotations

import sqlalchemy as sa


def test_storages_read_the_scripts_once_and_an_old_database_is_still_seen(tmp_path, monkeypatch):
    import alembic.script.base as alembic_base
    import dagster._core.storage.sql as dagster_sql
    from alembic.script import ScriptDirectory
    from dagster._core.storage.runs.sqlite import sqlite_run_storage

    from lakehouse.throughput import dagster_storage
    from lakehouse.throughput.dagster_storage import LakehouseSqliteStorage

    monkeypatch.setattr(dagster_storage._ScriptsReadOnce, "_read", {})
    reads = []
    load = alembic_base.ScriptDirectory._load_revisions

    def counted(self):
        reads.append(self.dir)
        yield from load(self)

    monkeypatch.setattr(alembic_base.ScriptDirectory, "_load_revisions", counted)
    LakehouseSqliteStorage(str(tmp_path / "a"))  # new: runs, event index and schedules checked, created, stamped
    created = len(reads)
    # opening existing storages checks each database again: Dagster's scripts are not read again
    # (before: once per check, three per storage)
    for base in ("a", "a", "a"):
        storage = LakehouseSqliteStorage(str(tmp_path / base))
        assert storage.run_storage is not None and storage.event_log_storage is not None
    assert len(reads) == created, reads

    cfg = dagster_sql.get_alembic_config(sqlite_run_storage.__file__)
    scripts = ScriptDirectory.from_config(cfg)  # Alembic's own class: not shared, reads the scripts itself
    head = scripts.get_current_head()
    down = scripts.get_revision(head).down_revision
    assert len(reads) == created + 1
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'a' / 'history' / 'runs.db'}")
    with engine.connect() as conn:
        assert dagster_sql.check_alembic_revision(cfg, conn) == (head, head)
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": down})
        conn.commit()
        assert dagster_sql.check_alembic_revision(cfg, conn) == (down, head)  # behind the head: still seen
    engine.dispose()
    assert len(reads) == created + 1
