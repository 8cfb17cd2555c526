"""What the platform needs from Dagster and Dagster has no public API for (written for Dagster 1.13).

Everything else uses `dagster`'s public names only. Two needs remain, both here and nowhere else:

1. SQLite pool slots exact across processes (`LakehouseSqliteStorage`). Dagster claims a pool slot
   with a SELECT of a free slot followed by an UPDATE that does not re-check it (SQLite has no
   `SELECT ... FOR UPDATE SKIP LOCKED`), so two processes claiming the same pool in the same instant
   can both win its one slot: four processes taking turns on a pool of limit 1 held it two at a
   time within seconds (tests/test_pools_headless.py). Dagster's SQLite storage also creates its
   databases without a lock, so two processes opening a fresh instance at once fail with "table runs
   already exists" (tests/test_instance_first_open.py). The storage below is Dagster's SQLite
   storage (same files, same layout) whose slot-table changes and first creation hold a `flock`.
   Dagster's storage classes are not exported from `dagster`, hence the private imports. PostgreSQL
   storage (deploy/dagster.yaml) locks the row and needs none of this. Configure it in dagster.yaml:

       storage:
         custom:
           module: lakehouse.compat.dagster
           class: LakehouseSqliteStorage
           config:
             base_dir: {env: DAGSTER_HOME}

2. Submitting a run of a code location's job to the instance's run queue from a long-lived process
   with a run id of the caller's choice (`workspace_context`, `create_run`; lakehouse/orchestration/gateway.py).
   Dagster's public clients for that are the GraphQL API (a running webserver) and `dagster job
   launch` (a process, and a code-server start, per run); the in-process path is what `dagster job
   launch` does internally.

`SUPPORTED` names the Dagster minor versions this was written for; tests/test_compat_versions.py
fails on any other, so an upgrade re-reads these private APIs before it is taken.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from dagster._core.storage.base_storage import DagsterStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage

SUPPORTED = ("1.13",)  # Dagster minor versions this module was checked against
LOCK_FILE = ".pool-slots.lock"
INIT_LOCK, INIT_DONE = ".storage-init.lock", ".storage-initialised"


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


@contextmanager
def first_open(base_dir: str) -> Iterator[None]:
    """Serialise the creation of the storage's databases across processes: until a marker file says
    they exist, opening holds an exclusive lock next to them; after that, opening takes no lock."""
    done = os.path.join(base_dir, INIT_DONE)
    if os.path.exists(done):
        yield
        return
    os.makedirs(base_dir, exist_ok=True)
    with file_lock(os.path.join(base_dir, INIT_LOCK)):
        yield
        with open(done, "a"):
            pass


class SerializedSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's SQLite event log storage whose pool-slot operations hold one cross-process lock."""

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
    """Dagster's SQLite storage (same files, same layout under `base_dir`) with
    `SerializedSqliteEventLogStorage` as its event log storage, created under `first_open`."""

    def __init__(self, base_dir: str, inst_data=None):
        self.base_dir = base_dir
        with first_open(base_dir):
            self._run_storage = SqliteRunStorage.from_local(os.path.join(base_dir, "history", ""))
            self._event_log_storage = SerializedSqliteEventLogStorage(os.path.join(base_dir, "history", "runs", ""))
            self._schedule_storage = SqliteScheduleStorage.from_local(os.path.join(base_dir, "schedules"))
        self._inst_data = inst_data
        DagsterStorage.__init__(self)

    @classmethod
    def config_type(cls):  # noqa: D102 - Dagster's ConfigurableClass hook
        from dagster import StringSource

        return {"base_dir": StringSource}

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: D102 - Dagster's ConfigurableClass hook
        os.makedirs(config_value["base_dir"], exist_ok=True)
        return cls(config_value["base_dir"], inst_data=inst_data)


def workspace_context(instance, workspace_file: str):
    """A process-long workspace (its code servers started) over a workspace.yaml."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    return WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[workspace_file]))


def create_run(instance, code_location, remote_repo, job_name: str, tags: Mapping[str, str], run_id: str):
    """The run `dagster job launch` creates for a job of a loaded code location (not yet submitted)."""
    from dagster._cli.job import _create_run

    return _create_run(instance=instance, code_location=code_location, remote_repo=remote_repo,
                       remote_job=remote_repo.get_full_job(job_name), run_config={}, tags=dict(tags),
                       op_selection=None, run_id=run_id)
