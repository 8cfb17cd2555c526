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
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

import dagster._core.storage.sql as dagster_sql
from alembic.script import ScriptDirectory
from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._utils import mkdir_p

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


class SerializedSqliteEventLogStorage(SqliteEventLogStorage):
    """SQLite event log storage whose pool-slot operations hold one cross-process lock."""

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


class LakehouseSqliteStorage(DagsterSqliteStorage):
    """`DagsterSqliteStorage` with `SerializedSqliteEventLogStorage` as its event log storage."""

    def __init__(self, base_dir: str, inst_data=None):
        self.base_dir = base_dir
        self._run_storage = SqliteRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = SerializedSqliteEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = SqliteScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        DagsterStorage.__init__(self)

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: D102 - Dagster's ConfigurableClass hook
        mkdir_p(config_value["base_dir"])
        return cls(config_value["base_dir"], inst_data=inst_data)
