"""A fresh Dagster home's databases and each run's event shard are copies of stamped templates
(issue 21: creating them with Dagster's DDL and Alembic stamp cost ~0.3 s of CPU per fresh home and
~0.05 s per run): the copies are what Dagster itself creates, Dagster's revision checks find them
at head, they never replace an existing database, and a storage that is not wholly new is left to
Dagster."""

from __future__ import annotations

import os
import re
import sqlite3
from contextlib import closing

import pytest

STAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?")  # when a data migration ran
DATABASES = ("history/runs.db", "history/runs/index.db", "schedules/schedules.db", "history/runs/run1.db")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("template_cache")  # one build for the tests that only read it


@pytest.fixture
def cache(shared_cache, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_CACHE_DIR", str(shared_cache))
    monkeypatch.delenv("LAKEHOUSE_DAGSTER_TEMPLATES", raising=False)
    return shared_cache


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAKEHOUSE_DAGSTER_TEMPLATES", raising=False)
    return tmp_path / "cache"


def _contents(path: str) -> tuple:
    with closing(sqlite3.connect(path)) as conn:
        schema = sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
        rows = {name: sorted(STAMP.sub("<time>", repr(row)) for row in conn.execute(f'SELECT * FROM "{name}"'))
                for kind, name, _t, _s in schema if kind == "table" and name != "sqlite_sequence"}
        return schema, rows, conn.execute("PRAGMA journal_mode").fetchone()[0]


def _storage(base, monkeypatch, *, templates: bool):
    from lakehouse.throughput.dagster_storage import LakehouseSqliteStorage

    monkeypatch.setenv("LAKEHOUSE_DAGSTER_TEMPLATES", "1" if templates else "0")
    storage = LakehouseSqliteStorage(str(base))
    with storage.event_log_storage.run_connection("run1"):
        pass
    return storage


def test_copies_are_what_dagster_creates_and_at_head(tmp_path, cache, monkeypatch):
    import dagster._core.storage.sql as dagster_sql
    import sqlalchemy as sa
    from dagster._core.storage.event_log.sqlite import sqlite_event_log
    from dagster._core.storage.runs.sqlite import sqlite_run_storage
    from dagster._core.storage.schedules.sqlite import sqlite_schedule_storage

    copied = _storage(tmp_path / "copied", monkeypatch, templates=True)
    _storage(tmp_path / "dagster", monkeypatch, templates=False)
    assert any(cache.rglob("shard.db")), "no template was built"
    for rel in DATABASES:
        got, want = _contents(str(tmp_path / "copied" / rel)), _contents(str(tmp_path / "dagster" / rel))
        assert got == want, rel  # tables, indexes, Alembic revision, data-migration marks, WAL mode
        assert got[1].get("alembic_version"), rel
    # Dagster's own revision check (what `dagster instance migrate` and every open consult) sees head
    scripts = {"history/runs.db": sqlite_run_storage, "history/runs/index.db": sqlite_event_log,
               "history/runs/run1.db": sqlite_event_log, "schedules/schedules.db": sqlite_schedule_storage}
    for rel, module in scripts.items():
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'copied' / rel}")
        with engine.connect() as conn:
            db_rev, head = dagster_sql.check_alembic_revision(dagster_sql.get_alembic_config(module.__file__), conn)
        engine.dispose()
        assert db_rev == head and head, (rel, db_rev, head)
    # an instance's identity is not in the template: two homes get two run storage ids
    other = _storage(tmp_path / "copied2", monkeypatch, templates=True)
    assert copied.run_storage.get_run_storage_id() != other.run_storage.get_run_storage_id()


def test_an_existing_database_is_never_replaced_and_old_storage_not_seeded(tmp_path, cache, monkeypatch):
    from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage

    from lakehouse.throughput.dagster_storage import SHARD_TEMPLATE, _place, seed_new_storage, templates

    source = templates()
    assert source is not None
    dest = tmp_path / "run.db"
    dest.write_bytes(b"not a template")
    assert not _place(os.path.join(source, SHARD_TEMPLATE), str(dest))
    assert dest.read_bytes() == b"not a template"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".template-")]  # no temporary left
    # a storage with one database already there is Dagster's to complete, not a template's
    old = tmp_path / "old"
    SqliteRunStorage.from_local(str(old / "history"))
    assert not seed_new_storage(str(old))
    assert not (old / "history" / "runs").exists() and not (old / "schedules").exists()
    assert seed_new_storage(str(tmp_path / "new"))


def test_without_a_writable_cache_dagster_creates_the_databases(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv("LAKEHOUSE_CACHE_DIR", str(blocked / "cache"))
    monkeypatch.delenv("LAKEHOUSE_DAGSTER_TEMPLATES", raising=False)
    from lakehouse.throughput.dagster_storage import templates

    assert templates() is None
    storage = _storage(tmp_path / "home", monkeypatch, templates=True)
    assert storage.run_storage.get_runs() == []
    for rel in DATABASES:
        assert (tmp_path / "home" / rel).is_file(), rel


def test_a_cache_removed_while_running_falls_back_to_dagster(tmp_path, fresh_cache, monkeypatch):
    import shutil

    import sqlalchemy as sa

    from lakehouse.throughput.dagster_storage import templates

    storage = _storage(tmp_path / "home", monkeypatch, templates=True)
    shutil.rmtree(templates())  # e.g. the user cleared ~/.cache during a long-lived UI process
    with storage.event_log_storage.run_connection("run2") as conn:  # Dagster's _initdb creates it
        assert conn.execute(sa.text("SELECT count(*) FROM event_logs")).scalar() == 0
    assert templates() is not None  # rebuilt on the next ask



def test_a_builder_that_loses_the_race_uses_the_winners_templates(fresh_cache, monkeypatch):
    import shutil

    from lakehouse.throughput import dagster_storage as ds

    real = ds._build_templates

    def build_and_lose(into):
        real(into)
        shutil.copytree(into, ds._templates_path())  # another process renamed its copy into place first

    monkeypatch.setattr(ds, "_build_templates", build_and_lose)
    assert ds.templates() == ds._templates_path()
    assert os.path.isfile(os.path.join(ds._templates_path(), ds.SHARD_TEMPLATE))
    assert [p.name for p in (fresh_cache / "dagster-sqlite").iterdir()] == [os.path.basename(ds._templates_path())]
