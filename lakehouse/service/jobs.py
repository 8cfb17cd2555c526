"""Load jobs: one row per accepted `POST /load`, keyed by the Dagster run that carries it out.

The request is stored whole (the run reads it from here: a run tag carries only the job id), and
the run writes its result or its error back, so `GET /load/{id}` can answer with file and row
counts and the error in the load's own words. Plain functions over the control DB; no Dagster.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from lakehouse.metadata.schema import load_jobs
from lakehouse.metadata.store import MetadataStore

if TYPE_CHECKING:
    from lakehouse.platform import Platform
    from lakehouse.stage.entity_raw import LoadRequest, LoadResult

JOB_TAG = "lakehouse/load_job"



def _now() -> datetime:
    return datetime.now(UTC)


def create(store: MetadataStore, job_id: str, request: LoadRequest) -> None:
    store.create_all()
    with store.engine.begin() as conn:
        conn.execute(sa.insert(load_jobs).values(
            job_id=job_id, tenant_id=request.tenant_id, application=request.application.lower(),
            request=request.model_dump_json(), submitted_at=_now()))


def get(store: MetadataStore, job_id: str) -> dict[str, Any] | None:
    store.create_all()
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(load_jobs).where(load_jobs.c.job_id == job_id)).mappings().first()
    if row is None:
        return None
    out = dict(row)
    out["request"] = json.loads(out["request"])
    out["result"] = json.loads(out["result"]) if out["result"] else None
    return out


def _update(store: MetadataStore, job_id: str, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.update(load_jobs).where(load_jobs.c.job_id == job_id).values(**values))


def record_error(store: MetadataStore, job_id: str, error: str) -> None:
    _update(store, job_id, error=error[:4000], finished_at=_now())


def run(platform: Platform, job_id: str, run_id: str, application_id: str) -> LoadResult:
    """What the entity_raw asset does for a service job: load exactly the stored request."""
    from lakehouse.stage import entity_raw

    job = get(platform.store, job_id)
    if job is None:
        raise LookupError(f"load job {job_id!r} is not in the control DB (table load_jobs)")
    request = entity_raw.LoadRequest.model_validate(job["request"])
    if request.application.lower() != application_id.lower():
        raise ValueError(f"load job {job_id!r} is for application {request.application!r}, "
                         f"not {application_id!r}")
    _update(platform.store, job_id, started_at=_now(), error=None)
    try:
        result = entity_raw.load(platform, request, run_id=run_id)
    except Exception as exc:
        record_error(platform.store, job_id, concise_error(exc))
        raise
    _update(platform.store, job_id, finished_at=_now(), result=json.dumps(result_counts(result)))
    return result


def result_counts(result: LoadResult) -> dict[str, Any]:
    return {"table": result.table, "mode": result.mode, "files_loaded": result.files_loaded,
            "files_already_loaded": result.files_skipped, "files_quarantined": len(result.quarantined),
            "empty_files": result.empty_files, "rows_written": result.rows_written,
            "records_quarantined": result.records_quarantined, "typenames": result.typenames,
            "snapshot_id": result.snapshot_id, "quarantined_files": result.quarantined[:100],
            "engine": result.engine, "engine_reason": result.engine_reason}


def concise_error(exc: BaseException) -> str:
    """What a client can read: the exception and its causes, without JVM stack frames (the run's
    event log keeps the full trace)."""
    lines = [ln.strip() for ln in str(exc).splitlines()
             if ln.strip() and not ln.lstrip().startswith(("at ", "... "))]
    return f"{type(exc).__name__}: " + "\n".join(lines[:12])[:2000]
