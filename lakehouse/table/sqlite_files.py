"""The embedded SQLite databases (catalog, control DB), shared by several processes at once.

In SQLite's default rollback-journal mode a reader with an open statement blocks a writer's commit,
so a Dagster code server evaluating a schedule, a run's PyIceberg reads and a run's Spark catalog
can starve each other into `database is locked`. Write-ahead logging lets readers and the one
writer proceed together; the setting is persistent in the file, so setting it once is enough.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from lakehouse import errors
from lakehouse.runtime import retry
from lakehouse.runtime.fileperms import apply_umask, file_mode

BUSY_TIMEOUT_S = 30
_DONE: set[Path] = set()


def sqlite_path(url: str) -> Path | None:
    """The file behind a `sqlite:///` or `jdbc:sqlite:` URL; None for any other database."""
    for prefix in ("sqlite:///", "jdbc:sqlite:"):
        if url.startswith(prefix):
            path = url[len(prefix):].split("?", 1)[0]
            return None if path in ("", ":memory:") else Path(path)
    return None


def prepare_sqlite(url: str) -> None:
    """Create the file (owner-only) and its folder and switch the database to WAL (idempotent, once per process)."""
    path = sqlite_path(url)
    if path is None or path in _DONE:
        return
    apply_umask()  # owner-only unless LAKEHOUSE_UMASK says otherwise; -wal/-shm files copy the file's mode
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, file_mode()))
    retry.call(retry.CREATE_RACE, lambda: _to_wal(path), what=f"switching {path.name} to WAL",
               also=lambda exc: errors.classify(exc).code == errors.DATABASE_BUSY)
    _DONE.add(path)


def _to_wal(path: Path) -> None:
    """Switching needs an exclusive lock, and SQLite answers `database is locked` at once (no busy
    wait) when processes set up one fresh home together; reading the mode first needs no lock, so
    only the first process of a home ever switches."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S)
    try:
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
