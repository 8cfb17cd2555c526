"""The load API (FastAPI): `POST /load`, `GET /load/{job_id}`, `GET /health`.

Every endpoint needs `Authorization: Bearer <LAKEHOUSE_API_TOKEN>`. A job belongs to the tenant
of its request; `GET /load/{job_id}` needs the caller's tenant in `X-Tenant-Id` and answers 404
for another tenant's job (its existence is not revealed either). Bodies are validated by the
pydantic model `lakehouse.entity_raw.LoadRequest` (an unknown or malformed field is a 422 naming
it); the application is validated against the registry (400 listing the valid ones).
"""

# no `from __future__ import annotations`: FastAPI reads these signatures at run time, and the
# dependencies they name (the bearer scheme) are local to create_app
import hmac
import logging
import uuid
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from lakehouse import entity_raw
from lakehouse.entity_raw import LoadRequest
from lakehouse.platform import Platform
from lakehouse.service import jobs
from lakehouse.service.runs import RunGateway, load_job_name

log = logging.getLogger(__name__)
TENANT_HEADER = "X-Tenant-Id"


def create_app(platform: Platform, gateway: RunGateway, token: str) -> FastAPI:
    if not token:
        raise ValueError("the load API needs a bearer token (LAKEHOUSE_API_TOKEN)")
    bearer = HTTPBearer(auto_error=False)

    def authorized(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        given = creds.credentials if creds is not None and creds.scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    app = FastAPI(title="lakehouse load API", version="1", dependencies=[Depends(authorized)],
                  description="Loads raw extraction files into entity_raw.<application> (seed 000).")

    @app.post("/load", status_code=status.HTTP_202_ACCEPTED)
    def submit_load(request: LoadRequest,
                    tenant: Annotated[str | None, Header(alias=TENANT_HEADER)] = None) -> dict[str, Any]:
        if tenant is not None and tenant != request.tenant_id:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"{TENANT_HEADER} {tenant!r} does not match the request's tenant_id")
        catalog = platform.catalog()
        try:
            app_row = entity_raw.require_application(catalog, request.application)
        except entity_raw.UnknownApplication as exc:
            valid = sorted(a.application_id for a in entity_raw.registered(catalog))
            raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                {"error": str(exc), "valid_applications": valid}) from None
        if not app_row.source_id and not request.bucket:
            raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                f"application {app_row.application_id!r} has no source_id: give `bucket`")
        job_id = uuid.uuid4().hex
        request = request.model_copy(update={"application": app_row.application_id})
        jobs.create(platform.store, job_id, request)
        tags = {jobs.JOB_TAG: job_id, "lakehouse/application": app_row.application_id,
                "lakehouse/tenant": request.tenant_id, "lakehouse/launched_by": "load-api"}
        try:
            gateway.submit(load_job_name(app_row.application_id), job_id, tags)
        except Exception as exc:
            log.exception("could not submit load job %s", job_id)
            jobs.record_error(platform.store, job_id, f"not submitted: {type(exc).__name__}: {exc}")
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                f"load job {job_id} could not be queued: {type(exc).__name__}") from None
        return {"job_id": job_id, "status": "queued", "application": app_row.application_id,
                "table": entity_raw.table_identifier(app_row.application_id), "status_url": f"/load/{job_id}"}

    @app.get("/load/{job_id}")
    def load_status(job_id: str, tenant: Annotated[str, Header(alias=TENANT_HEADER)]) -> dict[str, Any]:
        job = jobs.get(platform.store, job_id) if len(job_id) <= 64 else None
        if job is None or job["tenant_id"] != tenant:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no load job {job_id!r} for tenant {tenant!r}")
        state, dagster_status = gateway.status(job_id)
        error = job["error"]
        if state == "unknown":  # never reached the instance (submission failed) or purged from it
            state = "failed"
            error = error or "the Dagster run of this job no longer exists"
        elif state == "failed" and not error:
            error = gateway.failure(job_id) or f"run {dagster_status}"
        if state != "failed":
            error = None
        result = job["result"] or {}
        return {
            "job_id": job_id, "status": state, "dagster_status": dagster_status,
            "application": job["application"], "tenant_id": job["tenant_id"],
            "table": entity_raw.table_identifier(job["application"]),
            "submitted_at": job["submitted_at"], "started_at": job["started_at"], "finished_at": job["finished_at"],
            "files_loaded": result.get("files_loaded"), "files_already_loaded": result.get("files_already_loaded"),
            "files_quarantined": result.get("files_quarantined"), "rows_written": result.get("rows_written"),
            "records_quarantined": result.get("records_quarantined"), "snapshot_id": result.get("snapshot_id"),
            "quarantined_files": result.get("quarantined_files"), "engine": result.get("engine"),
            "engine_reason": result.get("engine_reason"), "error": error,
        }

    @app.get("/health")
    def health() -> JSONResponse:
        checks = {"control_db": _check(lambda: _ping_control_db(platform)),
                  "catalog": _check(lambda: _ping_catalog(platform)),
                  "dagster": _check(lambda: _ping_dagster(gateway))}
        ok = all(c["ok"] for c in checks.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks},
                            status_code=200 if ok else 503)

    return app


def _check(probe) -> dict[str, Any]:
    try:
        return {"ok": True, "detail": probe()}
    except Exception as exc:  # noqa: BLE001 - a health check reports, never raises; no URLs or secrets
        return {"ok": False, "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}


def _ping_control_db(platform: Platform) -> str:
    import sqlalchemy as sa

    with platform.store.engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    return "reachable"


def _ping_catalog(platform: Platform) -> str:
    n = len(platform.pyiceberg_catalog().list_namespaces())
    return f"reachable ({n} namespace(s))"


def _ping_dagster(gateway: RunGateway) -> str:
    h = gateway.health()
    if not h.ok:
        raise RuntimeError(h.detail)
    return h.detail
