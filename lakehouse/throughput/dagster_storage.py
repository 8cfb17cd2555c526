"""Dagster's SQLite instance storage with pool slots that are exact across processes.

Dagster claims a pool slot with a SELECT of a free slot followed by an UPDATE that does not
re-check it (SQLite has no `SELECT … FOR UPDATE SKIP LOCKED`), so two processes claiming the same
pool in the same instant can both win its one slot. Measured here: four processes taking turns on
a pool of limit 1 held it two at a time within seconds (`tests/test_pools_headless.py`). The
production storage (PostgreSQL, `deploy/dagster.yaml`) locks the row and needs nothing of this.

`LakehouseSqliteStorage` is `DagsterSqliteStorage` (same files, same layout under `base_dir`) whose
event log storage runs every slot-table change — claim, free, limit change — under an exclusive
`flock` on one file next to the databases, so claims from the CLI, the daemon's run workers and
the UI's runs are serialised. A claim is a few milliseconds of SQLite work, so the lock is never
held long. Configure it in `dagster.yaml` (as `deploy/dagster.dev.yaml` does):

    storage:
      custom:
        module: lakehouse.throughput.dagster_storage
        class: LakehouseSqliteStorage
        config:
          base_dir: {env: DAGSTER_HOME}

Importing this module also makes Dagster's storage read its Alembic scripts once per process
(`_ScriptsReadOnce`).

Commits without a disk flush each (issue 21): Dagster's SQLite storage opens a new engine and
connection for every event it stores (33 events, ~130 connections to the run's shard, the event
index and the runs database in a small `lakehouse run`), and with SQLite's defaults each commit
flushes the WAL to disk and each close of the last connection checkpoints the WAL into the
database and flushes it again: ~1.9 s of a small run's wall time measured waiting on the disk
here. Two bounded changes, for the files under this storage's `base_dir` only (the platform's
control DB and catalog are untouched):

* `synchronous` (config, default `NORMAL`): the journal is WAL, where SQLite documents `NORMAL`
  as consistent after any crash; a commit is durable when the process dies, and only an OS crash or
  a power loss can lose the last events (the platform's own audit log is in the control DB, which
  keeps SQLite's `FULL`). `FULL` restores Dagster's default.
* `keep_open()`: while a headless run executes (`lakehouse run`), one idle connection per database
  stays open, so the per-event connections' closes do not checkpoint; the last close at the end of
  the block checkpoints once per file. Durability is unchanged by it.
* one engine per database file inside `keep_open()` (a private-API override, see
  `_engine_for`): Dagster's `SqliteEventLogStorage._connect` and `SqliteRunStorage.connect` build
  a new SQLAlchemy engine with `NullPool` for every event and query (129 engines and ~140 SQLite
  connections in a small run, each with this module's connect hook); inside the block the same
  connection string gets one engine with SQLAlchemy's default pool for SQLite files, whose
  connections are reused and closed when the block ends. The transactions are Dagster's own (one
  `begin()` per call, under the same locks); outside the block Dagster's code runs unchanged.

New databases from stamped templates (issue 21): Dagster creates each SQLite database of a fresh
instance (runs, schedules, the event index) and each run's own event shard with `create_all`
(~50 DDL statements, each autocommitted while the file is still in rollback-journal mode), an
Alembic `stamp head` and, for a new instance, its data migrations: ~0.3 s of CPU and ~0.4 s of wall
time per fresh home, ~0.05 s per run shard. `templates()` builds each kind once per (Dagster,
SQLAlchemy, SQLite version, this module's `TEMPLATE_VERSION`) with Dagster's own, unchanged
storage classes in a cache directory (`$LAKEHOUSE_CACHE_DIR`, else `$XDG_CACHE_HOME/lakehouse`,
else `~/.cache/lakehouse`; built in a private directory, then renamed into place, so concurrent
builders never see half of one), and a fresh storage or a new run shard is a copy of it, hard-
linked into place only if no file of that name exists (so it never replaces a database another
process created first). The copy is the file Dagster would have created: same tables, indexes,
Alembic revision and data-migration marks, no rows that identify an instance (the run storage id
is created lazily, on first ask). Dagster's own checks then find it up to date and create nothing;
`dagster instance migrate` sees the head revision. Only a wholly new storage directory (none of
the three databases, no run shard) is seeded; anything else is Dagster's path unchanged. Without a
writable cache directory, or with `LAKEHOUSE_DAGSTER_TEMPLATES=0`, nothing is copied.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager

import dagster._core.storage.sql as dagster_sql
from alembic.script import ScriptDirectory
from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._utils import mkdir_p
from dagster.version import __version__ as DAGSTER_VERSION
from sqlalchemy import __version__ as SQLALCHEMY_VERSION
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine

from lakehouse.settings import DagsterSettings, PathSettings, current

LOCK_FILE = ".pool-slots.lock"


class _ScriptsReadOnce(ScriptDirectory):
    """Dagster's `check_alembic_revision` builds a new `ScriptDirectory` per call, which loads every
    one of Dagster's ~90 migration scripts to find the head revision; opening a SQLite instance and
    starting one run checks four databases (runs, event index, schedules, the run's own event
    shard): ~0.15 s of CPU per `lakehouse run` (issue 21). The scripts are package files that do
    not change while a process runs, so the directory is read once per script location; each
    check still reads the database's own revision, so an out-of-date database is still reported
    (`tests/test_dagster_storage_scripts.py`). Bound to `dagster._core.storage.sql` only: Alembic itself,
    Dagster's migrate/stamp commands and the platform's own migrations are untouched."""

    _read: dict[str, ScriptDirectory] = {}

    @classmethod
    def from_config(cls, config) -> ScriptDirectory:
        location = config.get_main_option("script_location") or ""
        script = cls._read.get(location)
        if script is None:
            script = cls._read[location] = ScriptDirectory.from_config(config)
        return script


if dagster_sql.ScriptDirectory is ScriptDirectory:
    dagster_sql.ScriptDirectory = _ScriptsReadOnce


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Exclusive lock between processes (and threads: each call opens its own descriptor)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


INIT_LOCK, INIT_DONE = ".storage-init.lock", ".storage-initialised"


@contextmanager
def first_open(base_dir: str) -> Iterator[None]:
    """Serialise the creation of the storage's databases across processes.

    Dagster's SQLite run and schedule storages check for their tables, then `create_all` and stamp
    the Alembic revision, with no lock: two processes opening a fresh instance at once (two first
    `lakehouse run`s, a run and `dagster dev`, the daemon and a client) fail with "table runs
    already exists" or "alembic_version has more than one head" (tests/test_instance_first_open.py).
    Until a marker file says the databases exist, opening holds an exclusive lock next to them; after
    that, opening takes no lock (the marker is written only once all three are created)."""
    done = os.path.join(base_dir, INIT_DONE)
    if os.path.exists(done):
        yield
        return
    mkdir_p(base_dir)
    with file_lock(os.path.join(base_dir, INIT_LOCK)):
        yield
        with open(done, "a"):
            pass


TEMPLATES_ENV, CACHE_ENV = "LAKEHOUSE_DAGSTER_TEMPLATES", "LAKEHOUSE_CACHE_DIR"
#: bump when what a template holds changes (it is part of the cache key)
TEMPLATE_VERSION = 1
#: template file -> (the storage directory relative to base_dir, the database file in it)
_TEMPLATE_FILES = {"runs.db": ("history", "runs.db"), "index.db": ("history/runs", "index.db"),
                   "schedules.db": ("schedules", "schedules.db")}
SHARD_TEMPLATE = "shard.db"
_built: set[str] = set()  # template directories known complete in this process
_TEMPLATES_LOCK = threading.Lock()


def _cache_root() -> str:
    configured = current(PathSettings).cache_dir  # LAKEHOUSE_CACHE_DIR
    if configured:
        return configured
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "lakehouse")


def _templates_path() -> str:
    key = f"dagster-{DAGSTER_VERSION}-sqlalchemy-{SQLALCHEMY_VERSION}-sqlite-{sqlite3.sqlite_version}-t{TEMPLATE_VERSION}"
    return os.path.join(_cache_root(), "dagster-sqlite", key)


def _build_templates(into: str) -> None:
    """Dagster's own storage classes create each database, exactly as for a new instance."""
    runs = SqliteRunStorage.from_local(os.path.join(into, "history"))
    events = SqliteEventLogStorage(os.path.join(into, "history", "runs"))
    with events.run_connection("shard"):
        pass
    SqliteScheduleStorage.from_local(os.path.join(into, "schedules"))
    del runs, events  # NullPool engines: every connection is closed, each WAL checkpointed and removed
    for name, (folder, db) in _TEMPLATE_FILES.items():
        os.replace(os.path.join(into, folder, db), os.path.join(into, name))
    os.replace(os.path.join(into, "history", "runs", "shard.db"), os.path.join(into, SHARD_TEMPLATE))
    for folder in ("history", "schedules"):  # only lock files are left in them
        shutil.rmtree(os.path.join(into, folder))
    with closing(sqlite3.connect(os.path.join(into, "runs.db"))) as conn, conn:
        conn.execute("DELETE FROM instance_info")  # an instance's identity is created lazily: none here
    for name in (*_TEMPLATE_FILES, SHARD_TEMPLATE):
        path = os.path.join(into, name)
        if any(os.path.exists(path + suffix) for suffix in ("-wal", "-shm", "-journal")):
            raise RuntimeError(f"template {path} still has a journal beside it")


def templates() -> str | None:
    """The directory of stamped template databases for this Dagster (built on first use), or None
    when templates are off or the cache directory cannot be written."""
    if not current(DagsterSettings).dagster_templates:  # LAKEHOUSE_DAGSTER_TEMPLATES=0
        return None
    final = _templates_path()
    with _TEMPLATES_LOCK:
        if final in _built:
            return final
        if not os.path.isfile(os.path.join(final, SHARD_TEMPLATE)):
            try:
                mkdir_p(os.path.dirname(final))
                building = tempfile.mkdtemp(prefix=".build-", dir=os.path.dirname(final))
            except OSError:
                return None
            try:
                _build_templates(building)
                try:
                    os.rename(building, final)  # atomic; fails if another process put its copy there first
                except OSError:
                    if not os.path.isfile(os.path.join(final, SHARD_TEMPLATE)):
                        raise
            finally:
                shutil.rmtree(building, ignore_errors=True)
        _built.add(final)
        return final


def _place(template: str, dest: str) -> bool:
    """Copy `template` to `dest` unless a file is there: a private copy, then a hard link, which
    fails rather than replace a database another process created meanwhile. True if placed."""
    if os.path.exists(dest):
        return False
    folder = os.path.dirname(dest)
    mkdir_p(folder)
    fd, tmp = tempfile.mkstemp(prefix=".template-", suffix=".db", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out, open(template, "rb") as src:
            shutil.copyfileobj(src, out)
        os.link(tmp, dest)
        return True
    except FileExistsError:
        return False
    except OSError:  # the cache was removed under us (or no hard links here): Dagster creates the file
        with _TEMPLATES_LOCK:
            _built.discard(os.path.dirname(template))
        return False
    finally:
        os.unlink(tmp)


def seed_new_storage(base_dir: str) -> bool:
    """A wholly new storage directory gets its three databases from the templates (module
    docstring); anything already there is left to Dagster. True if seeded."""
    events = os.path.join(base_dir, "history", "runs")
    existing = [os.path.join(base_dir, folder, db) for folder, db in _TEMPLATE_FILES.values()]
    if any(os.path.exists(p) for p in existing) or (os.path.isdir(events) and any(
            n.endswith(".db") for n in os.listdir(events))):
        return False
    source = templates()
    if source is None:
        return False
    for name, (folder, db) in _TEMPLATE_FILES.items():
        _place(os.path.join(source, name), os.path.join(base_dir, folder, db))
    return True


class SerializedSqliteEventLogStorage(SqliteEventLogStorage):
    """SQLite event log storage whose pool-slot operations hold one cross-process lock, and whose
    connections inside keep_open() come from one engine per database file."""

    @contextmanager
    def _connect(self, shard: str):
        # private API (dagster 1.x `SqliteEventLogStorage._connect`): the same steps as Dagster's
        # — the storage's lock, `_initdb` once per shard, one transaction — on a kept engine
        if shard not in self._initialized_dbs and (source := templates()) is not None:
            # a new run's shard: the stamped template, which `_initdb` then finds up to date
            _place(os.path.join(source, SHARD_TEMPLATE), self.path_for_shard(shard))
        engine = _engine_for(self.conn_string_for_shard(shard), {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS})
        if engine is None:
            with super()._connect(shard) as conn:
                yield conn
            return
        with self._db_lock:
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _slots(self):
        return file_lock(os.path.join(self._base_dir, LOCK_FILE))

    def claim_concurrency_slot(self, concurrency_key, run_id, step_key, priority=None):
        with self._slots():
            return super().claim_concurrency_slot(concurrency_key, run_id, step_key, priority)

    def free_concurrency_slots_for_run(self, run_id):
        with self._slots():
            return super().free_concurrency_slots_for_run(run_id)

    def free_concurrency_slot_for_step(self, run_id, step_key):
        with self._slots():
            return super().free_concurrency_slot_for_step(run_id, step_key)

    def set_concurrency_slots(self, concurrency_key, num):
        with self._slots():
            return super().set_concurrency_slots(concurrency_key, num)

    def delete_concurrency_limit(self, concurrency_key):
        with self._slots():
            return super().delete_concurrency_limit(concurrency_key)

    def initialize_concurrency_limit_to_default(self, concurrency_key):
        with self._slots():
            return super().initialize_concurrency_limit_to_default(concurrency_key)


class KeptEngineSqliteRunStorage(SqliteRunStorage):
    """`SqliteRunStorage` whose connections inside keep_open() come from one engine per file."""

    @contextmanager
    def connect(self):
        # private API (dagster 1.x `SqliteRunStorage.connect`): one transaction per call, as Dagster's
        engine = _engine_for(self._conn_string, {})
        if engine is None:
            with super().connect() as conn:
                yield conn
            return
        with engine.connect() as conn, conn.begin():
            yield conn


SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
#: storage directory (with a trailing separator) -> the `synchronous` level of its databases
_LEVELS: dict[str, str] = {}
_KEEP_LOCK = threading.Lock()
_kept: dict[str, sqlite3.Connection] | None = None  # {database path: idle connection} inside keep_open()
_engines: dict[str, Engine] | None = None  # {connection string: engine} inside keep_open()


def _engine_for(conn_string: str, connect_args: dict) -> Engine | None:
    """The block's engine for a database (created on first use), or None outside keep_open()."""
    with _KEEP_LOCK:
        if _engines is None:
            return None
        engine = _engines.get(conn_string)
        if engine is None:
            # SQLAlchemy's default pool for a SQLite file (QueuePool, connections usable from any
            # thread): a connection goes back to the pool after each transaction and is reused
            engine = _engines[conn_string] = create_engine(conn_string, connect_args=connect_args)
        return engine


def _storage_level(path: str) -> str | None:
    for base, level in _LEVELS.items():
        if path.startswith(base):
            return level
    return None


@event.listens_for(Engine, "connect")
def _on_connect(dbapi_connection, _record) -> None:
    """Every new SQLite connection of this process: one of a registered storage's databases gets
    its `synchronous` level, and inside keep_open() an idle companion connection (once per file)."""
    if not isinstance(dbapi_connection, sqlite3.Connection) or not _LEVELS:
        return
    path = next((row[2] for row in dbapi_connection.execute("PRAGMA database_list") if row[1] == "main"), "")
    level = _storage_level(path) if path else None
    if level is None:
        return
    dbapi_connection.execute(f"PRAGMA synchronous={level}")  # one of SYNCHRONOUS: checked on config
    with _KEEP_LOCK:
        if _kept is None or path in _kept:
            return
        # a new run shard is created in rollback mode and switched to WAL by its first connection:
        # keep it from the next one (an idle reader is what makes closes skip the checkpoint)
        if dbapi_connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            return
        keeper = sqlite3.connect(path, check_same_thread=False)
        keeper.execute("SELECT count(*) FROM sqlite_master").fetchall()  # attaches to the WAL index
        _kept[path] = keeper


@contextmanager
def keep_open() -> Iterator[None]:
    """While the block runs, Dagster storage databases this process connects to keep one idle
    connection open, closed (one checkpoint per file) when the block ends. For a process that
    executes a run (`lakehouse run`), not for a long-lived one such as the UI's."""
    global _kept, _engines
    with _KEEP_LOCK:
        outer, _kept = _kept, ({} if _kept is None else _kept)
        if outer is None:
            _engines = {}
    try:
        yield
    finally:
        if outer is None:
            with _KEEP_LOCK:
                kept, _kept = _kept or {}, None
                engines, _engines = _engines or {}, None
            for engine in engines.values():
                engine.dispose()  # closes the pooled connections
            for keeper in kept.values():
                keeper.close()


class LakehouseSqliteStorage(DagsterSqliteStorage):
    """`DagsterSqliteStorage` with `SerializedSqliteEventLogStorage` as its event log storage, and
    its databases' commits at the `synchronous` level configured (module docstring)."""

    def __init__(self, base_dir: str, inst_data=None, synchronous: str = "NORMAL"):
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"storage config synchronous: {synchronous!r} is not one of {', '.join(SYNCHRONOUS)}")
        for base in {os.path.abspath(base_dir), os.path.realpath(base_dir)}:  # as SQLite names it
            _LEVELS[os.path.join(base, "")] = synchronous.upper()
        self.base_dir = base_dir
        with first_open(base_dir):
            seed_new_storage(base_dir)
            self._run_storage = KeptEngineSqliteRunStorage.from_local(_runs_directory(base_dir))
            self._event_log_storage = SerializedSqliteEventLogStorage(_event_logs_directory(base_dir))
            self._schedule_storage = SqliteScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        DagsterStorage.__init__(self)

    @classmethod
    def config_type(cls):  # noqa: D102 - Dagster's ConfigurableClass hook
        from dagster import Field, StringSource

        return {"base_dir": StringSource, "synchronous": Field(str, is_required=False, default_value="NORMAL")}

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: D102 - Dagster's ConfigurableClass hook
        mkdir_p(config_value["base_dir"])
        return cls(config_value["base_dir"], inst_data=inst_data,
                   synchronous=config_value.get("synchronous", "NORMAL"))
