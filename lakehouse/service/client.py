"""The load API's client, as seed 000's connectors use it: `submit_and_poll(...)` and
`lakehouse load submit`.

Configured by the seed's variables (platform settings, lakehouse.settings.LoadClientSettings):
ENABLE_LAKEHOUSE_LOAD, MDLH_BASE_URL, LH_LOAD_RAW_NAMESPACE, LH_LOAD_RAW_TABLE_NAME (default: the
application), LH_LOAD_RAW_MODE, LH_LOAD_POLL_INTERVAL_SECONDS (10), LH_LOAD_MAX_POLL_ATTEMPTS
(360); plus the bearer token (LH_LOAD_TOKEN) and tenant (LH_LOAD_TENANT_ID) the platform's API
needs. Every request has a 30 s timeout (LH_LOAD_HTTP_TIMEOUT_SECONDS); each poll opens a fresh
session (no stale connections over an hour of polling); a 4xx answer to a poll fails at once (it
will not change), while a connection error, a timeout or a 5xx is retried until the attempts run out.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import requests

if TYPE_CHECKING:
    from lakehouse.settings import PlatformSettings

log = logging.getLogger(__name__)
TENANT_HEADER = "X-Atlan-Tenant-Id"
JOB_ID_HEADER = "X-Lakehouse-Job-Id"


class LoadFailed(RuntimeError):
    """The load was refused, failed, or did not finish within the poll attempts."""


def submit_and_poll(*, application: str | None = None, patterns: Sequence[str] = (), file_keys: Sequence[str] = (),
                    tenant_id: str | None = None, wait: bool = True, correlation_id: str | None = None,
                    settings: PlatformSettings | None = None, require_enabled: bool = True,
                    sleep: Callable[[float], None] = time.sleep, **fields: Any) -> dict[str, Any] | None:
    """Submit a load of `patterns`/`file_keys` into `<namespace>.<application>` and (with `wait`)
    poll until it is COMPLETED; the last answer. None when ENABLE_LAKEHOUSE_LOAD is off (and
    `require_enabled`). Raises LoadFailed when refused, FAILED, or still unfinished after the
    attempts. `fields`: more of the seed's body (`workflowId`, `workflowRunId`, ...)."""
    if settings is None:
        from lakehouse.settings import load_settings

        settings = load_settings()
    if require_enabled and not settings.enable_lakehouse_load:
        log.info("ENABLE_LAKEHOUSE_LOAD is off: no load submitted")
        return None
    table = application or settings.lh_load_raw_table_name
    if not table:
        raise ValueError("no application: pass one or set LH_LOAD_RAW_TABLE_NAME")
    tenant = tenant_id or settings.lh_load_tenant_id
    if not tenant:
        raise ValueError("no tenant: pass one or set LH_LOAD_TENANT_ID")
    base = settings.mdlh_base_url.rstrip("/")
    timeout = settings.lh_load_http_timeout_seconds
    correlation = correlation_id or uuid.uuid4().hex
    headers = {TENANT_HEADER: tenant, JOB_ID_HEADER: correlation}
    if settings.lh_load_token is not None:
        headers["Authorization"] = f"Bearer {settings.lh_load_token.get_secret_value()}"
    body = {"namespace": settings.lh_load_raw_namespace, "tableName": table, "mode": settings.lh_load_raw_mode,
            "fileKeys": list(file_keys), "patterns": list(patterns), **fields}  # fileKeys always sent, maybe []
    with requests.Session() as session:
        try:
            health = session.get(f"{base}/actuator/health", timeout=timeout)
        except requests.RequestException as exc:
            raise LoadFailed(f"load API at {base} unreachable: {type(exc).__name__}") from exc
        if health.status_code != 200 or health.json().get("status") != "UP":
            raise LoadFailed(f"load API at {base} is not up: HTTP {health.status_code}")
        answer = session.post(f"{base}/load", json=body, headers=headers, timeout=timeout)
    if answer.status_code != 202:
        raise LoadFailed(f"load refused: HTTP {answer.status_code}: {answer.text[:1000]}")
    job_id = answer.json()["jobId"]
    log.info("load job %s submitted (%s %s)", job_id, JOB_ID_HEADER, correlation)
    if not wait:
        return answer.json()
    last: str = "no answer"
    for attempt in range(1, settings.lh_load_max_poll_attempts + 1):
        sleep(settings.lh_load_poll_interval_seconds)
        try:
            with requests.Session() as session:  # a fresh session per poll
                poll = session.get(f"{base}/load/{job_id}/status", headers=headers, timeout=timeout)
        except requests.RequestException as exc:  # connection errors and timeouts: try again
            last = f"{type(exc).__name__}"
            log.warning("poll %d of load job %s: %s", attempt, job_id, last)
            continue
        if 400 <= poll.status_code < 500:  # will not change: fail fast
            raise LoadFailed(f"load job {job_id}: status poll refused: HTTP {poll.status_code}: {poll.text[:1000]}")
        if poll.status_code != 200:
            last = f"HTTP {poll.status_code}"
            continue
        state = poll.json()
        if state.get("status") == "COMPLETED":
            return state
        if state.get("status") == "FAILED":
            raise LoadFailed(f"load job {job_id} failed: {state.get('error')}")
        last = str(state.get("status"))
    raise LoadFailed(f"load job {job_id} unfinished after {settings.lh_load_max_poll_attempts} polls "
                     f"(last: {last})")
