"""Create and upgrade the control database with Alembic (lakehouse/metadata/migrations).

`upgrade` is the one way tables come to exist: `lakehouse metadata apply`, platform start-up and
the first use of the control DB in a process call it; importing a module never does. It runs once
per database per process (afterwards a cached no-op), under a lock, so that several processes
starting on one fresh home at once (tests/test_concurrent_first_start.py) migrate it exactly once:
a PostgreSQL advisory lock, or on the embedded SQLite file an `flock` on a file next to it.

A control DB created before migrations existed has tables but no `alembic_version`: the baseline
revision creates only what it lacks, so upgrading it works like upgrading any other revision.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
#: pg_advisory_lock key of the control DB migration (an arbitrary constant: "lakemigr" in ASCII)
_PG_LOCK_KEY = 0x6C616B656D696772 & 0x7FFFFFFFFFFFFFFF

_done: set[str] = set()
_guard = threading.Lock()


def _config(connection: sa.Connection | None = None):
    """Alembic's configuration, without an alembic.ini: the scripts ship inside the package."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection  # a URL would go through ConfigParser's % interpolation
    return cfg


def head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head()


_REV = re.compile(r"""^(down_revision|revision)\s*(?::[^=]*)?=\s*(?:["']([^"']+)["']|None)""", re.M)


@functools.cache
def script_head() -> str | None:
    """The newest revision, read from the scripts' `revision` / `down_revision` lines without
    Alembic (importing it and loading the scripts costs ~0.3 s of CPU in every process that opens
    the control DB); None when that reading is not a single chain (Alembic then decides)."""
    revisions, downs = set(), set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        found = dict((k, v) for k, v in _REV.findall(path.read_text()))
        if not found.get("revision"):
            return None
        revisions.add(found["revision"])
        if found.get("down_revision"):
            downs.add(found["down_revision"])
    heads = revisions - downs
    return next(iter(heads)) if len(heads) == 1 else None


def current(engine: sa.Engine) -> str | None:
    """The revision the database is at (None: never migrated, or no database yet)."""
    from lakehouse.table.sqlite_files import sqlite_path

    path = sqlite_path(str(engine.url))
    if path is not None and not path.exists():  # looking must not create the file
        return None
    with engine.connect() as conn:
        return _current(conn)


def _stamped(engine: sa.Engine) -> str | None:
    """`current`, read with one SELECT (no Alembic); None if there is no database or version yet."""
    from lakehouse.table.sqlite_files import sqlite_path

    path = sqlite_path(str(engine.url))
    if path is not None and not path.exists():
        return None
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    except sa.exc.DBAPIError:  # no version table yet
        return None
    return rows[0][0] if len(rows) == 1 else None


@contextlib.contextmanager
def _lock(engine: sa.Engine) -> Iterator[None]:
    from lakehouse.table.sqlite_files import sqlite_path

    path = sqlite_path(str(engine.url))
    if engine.dialect.name == "sqlite":
        if path is None:  # in-memory: one process only
            yield
            return
        fd = os.open(f"{path}.migrate.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
        return
    yield


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Bring the control DB to `revision` (default: the newest), once per database per process."""
    key = f"{engine.url}@{revision}"
    if key in _done:
        return
    if revision == "head" and script_head() is not None and _stamped(engine) == script_head():
        _done.add(key)  # the usual case, a database already at the newest revision: no Alembic
        return
    with _guard:
        if key in _done:
            return
        from alembic import command

        from lakehouse.table.sqlite_files import prepare_sqlite

        prepare_sqlite(str(engine.url))
        with _lock(engine), engine.begin() as conn:
            before = _current(conn)
            command.upgrade(_config(conn), revision)
            after = _current(conn)
        if before != after:
            log.info("control DB %s migrated from %s to %s", engine.url.render_as_string(hide_password=True),
                     before or "nothing", after)
        _done.add(key)


def _current(conn: sa.Connection) -> str | None:
    from alembic.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def forget(engine: sa.Engine) -> None:
    """Make the next `upgrade` in this process look at the database again (tests: "a new process")."""
    for key in [k for k in _done if k.startswith(f"{engine.url}@")]:
        _done.discard(key)


def revision(engine: sa.Engine, message: str) -> str:
    """Write a new revision file with the differences between the newest revision and
    lakehouse.metadata.schema (Alembic autogenerate), against a database at head. For developers:
    run it after adding a table or a model field, then read and commit the file."""
    from alembic import command

    upgrade(engine)
    with engine.begin() as conn:
        script = command.revision(_config(conn), message=message, autogenerate=True)
    return str(script.path)
