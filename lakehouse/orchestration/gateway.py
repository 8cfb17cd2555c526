"""Load jobs as Dagster runs: submitted through the instance's run coordinator, observed by id.

A job is a run of `entity_raw__<app>__load_job` created from the code location (as `dagster job
launch` creates runs) and handed to `instance.submit_run`: with the QueuedRunCoordinator it waits
in the run queue, so the instance's run limits, tag limits, priorities and pools apply to loads
exactly as to pipeline runs. The run id is the job id.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Dagster run status -> the load API's status
STATUS = {"QUEUED": "queued", "NOT_STARTED": "queued", "STARTING": "queued", "MANAGED": "queued",
          "STARTED": "running", "CANCELING": "running",
          "SUCCESS": "success", "FAILURE": "failed", "CANCELED": "failed"}


def load_job_name(application_id: str) -> str:
    return f"entity_raw__{application_id.lower()}__load_job"


@dataclass
class Health:
    ok: bool
    detail: str


class RunGateway:
    """The service's handle on the Dagster instance (DAGSTER_HOME) and the code location."""

    def __init__(self, workspace: str | Path, location_name: str = "lakehouse", instance: Any = None):
        import dagster as dg

        self.workspace = Path(workspace)
        self.location_name = location_name
        self.instance = instance or dg.DagsterInstance.get()
        self._context = None
        self._lock = threading.Lock()

    def _request_context(self, reload: bool = False):
        from lakehouse.compat.dagster import workspace_context

        if self._context is None:
            self._context = workspace_context(self.instance, str(self.workspace))
        elif reload:
            self._context.reload_code_location(self.location_name)
        ctx = self._context.create_request_context()
        error = ctx.get_code_location_error(self.location_name)
        if error is not None:
            raise RuntimeError(f"code location {self.location_name!r} failed to load: {error.message}")
        return ctx

    def start(self) -> None:
        """Load the code location now (a code server starts), not on the first request."""
        with self._lock:
            self._request_context()

    def close(self) -> None:
        with self._lock:
            if self._context is not None:
                self._context.__exit__(None, None, None)
                self._context = None

    def submit(self, job_name: str, run_id: str, tags: dict[str, str]) -> str:
        """Create the run from the code location and submit it to the run coordinator."""
        from lakehouse.compat.dagster import create_run  # what `dagster job launch` does

        with self._lock:
            for attempt in (1, 2):
                ctx = self._request_context(reload=attempt == 2)
                location = ctx.get_code_location(self.location_name)
                repo = next(iter(location.get_repositories().values()))
                if not repo.has_job(job_name):
                    if attempt == 1:  # an application registered since the code location loaded
                        continue
                    raise LookupError(f"job {job_name!r} is not in code location {self.location_name!r}")
                run = create_run(self.instance, location, repo, job_name, tags, run_id)
                return self.instance.submit_run(run.run_id, ctx).run_id
        raise AssertionError("unreachable")  # pragma: no cover

    def status(self, run_id: str) -> tuple[str, str | None]:
        """(queued|running|success|failed|unknown, the Dagster run status)."""
        run = self.instance.get_run_by_id(run_id)
        if run is None:
            return "unknown", None
        return STATUS.get(run.status.value, "running"), run.status.value

    def failure(self, run_id: str) -> str | None:
        from lakehouse.orchestration.runs import run_failure_message, step_failures

        steps = step_failures(self.instance, run_id)
        if steps:
            return "\n".join(f"{step}: {text}" for step, text in steps)
        return run_failure_message(self.instance, run_id)

    def health(self) -> Health:
        """The instance answers, and (with a queued coordinator) a daemon is dequeuing runs."""
        try:
            self.instance.get_runs(limit=1)
        except Exception as exc:  # noqa: BLE001 - reported
            return Health(False, f"Dagster instance storage: {type(exc).__name__}")
        coordinator = type(self.instance.run_coordinator).__name__
        if coordinator != "QueuedRunCoordinator":
            return Health(True, f"instance reachable ({coordinator})")
        beats = self.instance.get_daemon_heartbeats()
        beat = beats.get("QUEUED_RUN_COORDINATOR")
        if beat is None:
            return Health(False, "no dagster-daemon heartbeat: queued loads would never start")
        age = time.time() - beat.timestamp
        if age > 120:
            return Health(False, f"dagster-daemon last seen {age:.0f}s ago: queued loads are not starting")
        return Health(True, f"instance reachable; daemon seen {age:.0f}s ago")
