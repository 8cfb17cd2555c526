"""The embedded SQLite databases are shared by several processes (code server, daemon, runs): a
reader holding a read transaction must not make a writer fail with `database is locked`."""

import sqlite3

import pyarrow as pa

from lakehouse.metadata.store import MetadataStore
from lakehouse.settings import load_settings
from lakehouse.table.catalog import pyiceberg_catalog
from lakehouse.table.sqlite_files import sqlite_path


def test_sqlite_path_only_for_sqlite_urls(tmp_path):
    assert sqlite_path(f"sqlite:///{tmp_path}/c.db") == tmp_path / "c.db"
    assert sqlite_path(f"jdbc:sqlite:{tmp_path}/c.db") == tmp_path / "c.db"
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("postgresql://u@h/db") is None


def test_control_db_uses_wal(tmp_path):
    MetadataStore(f"sqlite:///{tmp_path / 'control.db'}").create_all()
    with sqlite3.connect(tmp_path / "control.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_catalog_commit_while_another_process_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME"):
        monkeypatch.delenv(var, raising=False)
    settings = load_settings()
    catalog = pyiceberg_catalog(settings)
    catalog.create_namespace("bronze")
    reader = sqlite3.connect(sqlite_path(settings.catalog_uri), timeout=0.1)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM iceberg_tables").fetchone()[0] == 0  # holds a read lock
    try:  # in rollback-journal mode this commit waits for the reader and then fails
        table = catalog.create_table("bronze.t", schema=pa.schema([("id", pa.int64())]))
        table.append(pa.table({"id": [1, 2]}))
    finally:
        reader.rollback()
        reader.close()
    assert catalog.load_table("bronze.t").scan().to_arrow().num_rows == 2
