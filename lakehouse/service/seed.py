"""Seed 000's wire format beside the platform's own (issue 43 item 1).

The seed's connectors call `GET /actuator/health`, `POST /load` with a camelCase body
(`fileKeys` (may be `[]`) and/or `patterns`, `namespace`, `tableName`, `mode`), expect `202` with
a `jobId`, and poll `GET /load/{jobId}/status` until `COMPLETED` (or `FAILED`); the tenant is the
`X-Atlan-Tenant-Id` header (required on these routes) and `X-Lakehouse-Job-Id` is a correlation id,
echoed in the answer and logged. A seed request becomes the platform's `LoadRequest` (the table is
the application, still validated against the registry), so both dialects load the same way.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from lakehouse.stage import entity_raw
from lakehouse.stage.entity_raw import LoadRequest

TENANT_HEADER = "X-Atlan-Tenant-Id"
JOB_ID_HEADER = "X-Lakehouse-Job-Id"
#: the platform's status -> the seed's
STATUS = {"queued": "PENDING", "running": "RUNNING", "success": "COMPLETED", "failed": "FAILED"}
_SEED_FIELDS = frozenset({"fileKeys", "tableName", "namespace"})


class SeedLoadRequest(BaseModel):
    """Seed 000's `/load` body (camelCase)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=False)

    namespace: str = entity_raw.NAMESPACE
    table_name: str = Field(min_length=1, description="the raw table: a registered application")
    mode: Literal["APPEND", "UPSERT"] = "APPEND"
    file_keys: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list)
    bucket: str | None = None
    typename: str | None = None
    workflow_id: str | None = None
    workflow_run_id: str | None = None
    connection_qualified_name: str | None = None
    extracted_at: int | None = None

    @field_validator("mode", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v


def is_seed_request(payload: dict[str, Any], atlan_tenant: str | None) -> bool:
    return atlan_tenant is not None or bool(_SEED_FIELDS & set(payload))


def require_tenant(atlan_tenant: str | None) -> str:
    if not atlan_tenant or not atlan_tenant.strip():
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"the {TENANT_HEADER} header is required")
    return atlan_tenant.strip()


def to_load_request(payload: dict[str, Any], atlan_tenant: str | None) -> LoadRequest:
    tenant = require_tenant(atlan_tenant)
    try:
        seed = SeedLoadRequest.model_validate(payload)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
    if seed.namespace != entity_raw.NAMESPACE:
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            f"namespace {seed.namespace[:200]!r} is not loaded here: the load API writes "
                            f"{entity_raw.NAMESPACE!r} (one table per registered application)")
    try:
        return LoadRequest(application=seed.table_name, tenant_id=tenant, mode=seed.mode, file_keys=seed.file_keys,
                           patterns=seed.patterns, bucket=seed.bucket, typename=seed.typename,
                           workflow_id=seed.workflow_id, workflow_run_id=seed.workflow_run_id,
                           connection_qualified_name=seed.connection_qualified_name, extracted_at=seed.extracted_at)
    except ValidationError as exc:  # e.g. neither fileKeys nor patterns
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def _echo(correlation: str | None) -> dict[str, str]:
    return {JOB_ID_HEADER: correlation[:200]} if correlation else {}


def accepted(job_id: str, application: str, correlation: str | None) -> JSONResponse:
    return JSONResponse({"jobId": job_id, "status": "PENDING", "namespace": entity_raw.NAMESPACE,
                         "tableName": application}, status_code=status.HTTP_202_ACCEPTED,
                        headers=_echo(correlation))


def status_answer(job: dict[str, Any], correlation: str | None) -> JSONResponse:
    return JSONResponse({
        "jobId": job["job_id"], "status": STATUS.get(job["status"], "RUNNING"),
        "namespace": entity_raw.NAMESPACE, "tableName": job["application"], "tenantId": job["tenant_id"],
        "filesLoaded": job["files_loaded"], "filesAlreadyLoaded": job["files_already_loaded"],
        "filesQuarantined": job["files_quarantined"], "rowsWritten": job["rows_written"],
        "snapshotId": job["snapshot_id"], "error": job["error"],
    }, headers=_echo(correlation))
