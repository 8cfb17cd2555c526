"""The load API (FastAPI): `POST /load`, `GET /load/{job_id}`, `GET /health`, `GET /actuator/health`.

Every request but liveness needs `Authorization: Bearer <token>`, checked from the headers before
any body is read (lakehouse.service.gate, which also refuses a body over `api_max_body_bytes` with
413). A token is either a per-tenant token (lakehouse.service.tokens: one tenant, a set of
applications) or the operator's shared `LAKEHOUSE_API_TOKEN` (every tenant; `X-Tenant-Id` then
says which). A job belongs to the tenant of its request; `GET /load/{job_id}` answers 404 for
another tenant's job (its existence is not revealed either). Bodies are validated by the pydantic
model `lakehouse.stage.entity_raw.LoadRequest` (an unknown or malformed field is a 422 naming it, never
echoing the input); the application is validated against the registry (400 listing the valid
ones the token may use). What a client reads names the keys it sent, never a server path
(`client_text`); the control DB and the run's event log keep the full text for the operator.
`/health` without a token is liveness (status only); with a token it is readiness with details.
"""

# no `from __future__ import annotations`: FastAPI reads these signatures at run time
import logging
import os
import re
import uuid
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import Body, FastAPI, Header, HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from lakehouse.orchestration.gateway import RunGateway, load_job_name
from lakehouse.platform import Platform
from lakehouse.service import jobs, seed, tokens
from lakehouse.service.gate import Gate
from lakehouse.service.tokens import Principal
from lakehouse.stage import entity_raw
from lakehouse.stage.entity_raw import LoadRequest

log = logging.getLogger(__name__)
TENANT_HEADER = "X-Tenant-Id"
MAX_KEY_CHARS = 1024


def create_app(platform: Platform, gateway: RunGateway, token: str = "", *, max_body_bytes: int | None = None,
               docs: bool | None = None) -> FastAPI:
    """`token`: the operator's shared token ("" = per-tenant tokens only)."""
    settings = platform.settings
    max_body = max_body_bytes if max_body_bytes is not None else settings.api_max_body_bytes
    docs = settings.api_docs if docs is None else docs

    def authenticate(presented: str) -> Principal | None:
        return tokens.verify(platform.store, presented, token)

    app = FastAPI(title="lakehouse load API", version="1",
                  docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
                  openapi_url="/openapi.json" if docs else None,
                  description="Loads raw extraction files into entity_raw.<application> (seed 000).")
    app.add_middleware(Gate, authenticate=authenticate, max_body_bytes=max_body)

    @app.exception_handler(RequestValidationError)
    def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each wrong value (`input`): a big body came back whole
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))[:500], "type": e.get("type")}
                  for e in exc.errors()[:50]]
        return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_ENTITY)

    def principal_of(request: Request) -> Principal:
        p = getattr(request.state, "principal", None)
        if p is None:  # only liveness routes are reachable without one
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                                headers={"WWW-Authenticate": "Bearer"})
        return p

    def submit(who: Principal, body: LoadRequest, correlation: str | None = None) -> tuple[str, str]:
        """(job id, application id) of an accepted load; HTTP errors for everything refused."""
        if not who.may_act_for(body.tenant_id):
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"this token does not act for tenant {_short(body.tenant_id)}")
        catalog = platform.catalog()
        if not who.may_use(body.application):
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"this token does not act for application {_short(body.application)}")
        try:
            app_row = entity_raw.require_application(catalog, body.application)
        except entity_raw.UnknownApplication:
            valid = sorted(a.application_id for a in entity_raw.registered(catalog) if who.may_use(a.application_id))
            raise HTTPException(status.HTTP_400_BAD_REQUEST, {
                "error": f"unknown application {_short(body.application)}: entity_raw tables exist only for "
                         f"registered applications; valid applications: {', '.join(valid) or '(none)'}",
                "valid_applications": valid}) from None
        if not app_row.source_id and not body.bucket:
            raise HTTPException(status.HTTP_400_BAD_REQUEST,
                                f"application {app_row.application_id!r} has no source_id: give `bucket`")
        problem = _request_problem(platform, catalog, app_row, body)
        if problem:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, problem)
        job_id = uuid.uuid4().hex
        body = body.model_copy(update={"application": app_row.application_id})
        jobs.create(platform.store, job_id, body)
        tags = {jobs.JOB_TAG: job_id, "lakehouse/application": app_row.application_id,
                "lakehouse/tenant": body.tenant_id, "lakehouse/launched_by": "load-api",
                "lakehouse/api_token": who.token_id}
        if correlation:
            tags["lakehouse/correlation_id"] = correlation[:200]
        log.info("load job %s accepted: tenant %s, application %s, token %s, %s %s", job_id, body.tenant_id,
                 app_row.application_id, who.token_id, seed.JOB_ID_HEADER, correlation or "-")
        try:
            gateway.submit(load_job_name(app_row.application_id), job_id, tags)
        except Exception as exc:
            log.exception("could not submit load job %s", job_id)
            jobs.record_error(platform.store, job_id, f"not submitted: {type(exc).__name__}: {exc}")
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                f"load job {job_id} could not be queued: {type(exc).__name__}") from None
        return job_id, app_row.application_id

    @app.post("/load", status_code=status.HTTP_202_ACCEPTED,
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                  "oneOf": [LoadRequest.model_json_schema(), seed.SeedLoadRequest.model_json_schema()]}}}}})
    def submit_load(request: Request, payload: Annotated[dict[str, Any], Body()],
                    tenant: Annotated[str | None, Header(alias=TENANT_HEADER)] = None,
                    atlan_tenant: Annotated[str | None, Header(alias=seed.TENANT_HEADER)] = None,
                    correlation: Annotated[str | None, Header(alias=seed.JOB_ID_HEADER)] = None) -> Any:
        """The platform's body (snake_case, `tenant_id`), or seed 000's (camelCase `fileKeys`/`patterns`,
        `tableName`, the tenant in `X-Atlan-Tenant-Id`): the answer is in the dialect of the request."""
        who = principal_of(request)
        if seed.is_seed_request(payload, atlan_tenant):
            body = seed.to_load_request(payload, atlan_tenant)
            job_id, application = submit(who, body, correlation)
            return seed.accepted(job_id, application, correlation)
        try:
            body = LoadRequest.model_validate(payload)
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        if tenant is not None and tenant != body.tenant_id:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"{TENANT_HEADER} {_short(tenant)} does not match the request's tenant_id")
        job_id, application = submit(who, body, correlation)
        return {"job_id": job_id, "status": "queued", "application": application,
                "table": entity_raw.table_identifier(application), "status_url": f"/load/{job_id}"}

    def job_status(who: Principal, job_id: str, tenant: str) -> dict[str, Any]:
        job = jobs.get(platform.store, job_id) if len(job_id) <= 64 else None
        if (job is None or job["tenant_id"] != tenant or not who.may_act_for(tenant)
                or not who.may_use(job["application"])):
            raise HTTPException(status.HTTP_404_NOT_FOUND,
                                f"no load job {_short(job_id)} for tenant {_short(tenant)}")
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
        roots = server_roots(platform)
        quarantined = result.get("quarantined_files")
        if quarantined:
            quarantined = [{**q, "error": client_text(q.get("error"), roots)} if isinstance(q, dict) else q
                           for q in quarantined]
        return {
            "job_id": job_id, "status": state, "dagster_status": dagster_status,
            "application": job["application"], "tenant_id": job["tenant_id"],
            "table": entity_raw.table_identifier(job["application"]),
            "submitted_at": job["submitted_at"], "started_at": job["started_at"], "finished_at": job["finished_at"],
            "files_loaded": result.get("files_loaded"), "files_already_loaded": result.get("files_already_loaded"),
            "files_quarantined": result.get("files_quarantined"), "rows_written": result.get("rows_written"),
            "records_quarantined": result.get("records_quarantined"), "snapshot_id": result.get("snapshot_id"),
            "quarantined_files": quarantined, "engine": result.get("engine"),
            "engine_reason": result.get("engine_reason"), "error": client_text(error, roots),
        }

    @app.get("/load/{job_id}")
    def load_status(request: Request, job_id: str,
                    tenant: Annotated[str | None, Header(alias=TENANT_HEADER)] = None) -> Any:
        who = principal_of(request)
        if tenant is None:
            if who.tenant_id is None:  # the shared token must say which tenant it asks for
                return JSONResponse({"detail": [{"loc": ["header", TENANT_HEADER], "msg": "Field required",
                                                 "type": "missing"}]}, status_code=422)
            tenant = who.tenant_id
        return job_status(who, job_id, tenant)

    @app.get("/load/{job_id}/status")
    def seed_load_status(request: Request, job_id: str,
                         atlan_tenant: Annotated[str | None, Header(alias=seed.TENANT_HEADER)] = None,
                         correlation: Annotated[str | None, Header(alias=seed.JOB_ID_HEADER)] = None) -> Any:
        """Seed 000's status route: `X-Atlan-Tenant-Id` required, camelCase answer."""
        who = principal_of(request)
        tenant = seed.require_tenant(atlan_tenant)
        if correlation:
            log.info("status of load job %s asked (%s %s)", job_id[:64], seed.JOB_ID_HEADER, correlation[:200])
        return seed.status_answer(job_status(who, job_id, tenant), correlation)

    @app.get("/health")
    def health(request: Request) -> JSONResponse:
        if getattr(request.state, "principal", None) is None:  # liveness: the process answers
            return JSONResponse({"status": "ok"})
        checks = {"control_db": _check(lambda: _ping_control_db(platform)),
                  "catalog": _check(lambda: _ping_catalog(platform)),
                  "dagster": _check(lambda: _ping_dagster(gateway))}
        ok = all(c["ok"] for c in checks.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "checks": checks},
                            status_code=200 if ok else 503)

    @app.get("/actuator/health")
    def actuator_health() -> dict[str, str]:
        """Seed 000's liveness, in Spring Boot actuator's shape."""
        return {"status": "UP"}

    return app


def _short(value: str, n: int = 200) -> str:
    """A client's own value, quoted and bounded (a body may be up to the size limit)."""
    return repr(value if len(value) <= n else value[:n] + "…")


# --------------------------------------------------------------------------- what a request may name


def key_problem(key: str, what: str = "file key") -> str | None:
    """Why a key or pattern is refused before anything is submitted, in words naming only the key."""
    if not key:
        return f"{what} '' is empty"
    if len(key) > MAX_KEY_CHARS:
        return f"{what} {_short(key)} is longer than {MAX_KEY_CHARS} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return f"{what} {_short(key)} contains a control character"
    forms = {key, unquote(key), unquote(unquote(key))}  # `%2e%2e%2f` is a '..' step to some reader
    for form in forms:
        norm = form.replace("\\", "/")
        if (norm.startswith("/") or re.match(r"^[A-Za-z]:", norm) or "://" in norm or norm.startswith("~")
                or ".." in PurePosixPath(norm).parts):
            return (f"{what} {_short(key)} is refused: keys are relative to the application's landing location "
                    "(no absolute path, URL, '~' or '..' step, also not URL-encoded)")
    return None


def _request_problem(platform: Platform, catalog, app_row, body: LoadRequest) -> str | None:
    for key in body.file_keys:
        if (p := key_problem(key)) is not None:
            return p
    for pat in body.patterns:
        if (p := key_problem(pat, "pattern")) is not None:
            return p
    src = next((s for s in catalog.sources if s.source_id == app_row.source_id), None) if app_row.source_id else None
    if src is None or src.kind != "files" or body.bucket:
        return None
    from lakehouse.ingest.files import landing_root

    try:
        root = os.path.realpath(landing_root(src, platform.settings.landing_dir))
    except ValueError:
        return f"application {app_row.application_id!r}: its landing location is misconfigured (ask the operator)"
    for key in body.file_keys:  # a symlink out of the landing location (the run checks again when it reads)
        real = os.path.realpath(os.path.join(root, key))
        if real != root and not real.startswith(root.rstrip("/") + "/"):
            return f"file key {_short(key)} is refused: it leads outside the application's landing location"
    return None


# --------------------------------------------------------------------------- what a client reads


_FILE_URL = re.compile(r"\bfile:/+[^\s'\"`,;)\]}>]*")
_ABS_PATH = re.compile(r"(?<![\w.~/\\-])/(?=[^\s/])[^\s'\"`,;)\]}>]*")


def server_roots(platform: Platform) -> list[str]:
    """The landing locations of the platform's `files` sources (their prefix is stripped, leaving the
    client's key), longest first."""
    from lakehouse.ingest.files import landing_root

    landing = platform.settings.landing_dir
    roots = {str(landing)}
    try:
        for src in platform.catalog().sources:
            if src.kind == "files":
                roots.add(str(landing_root(src, landing)))
    except Exception:  # noqa: BLE001 - without the catalog the generic redaction still applies
        log.debug("no catalog for the landing roots", exc_info=True)
    out = set()
    for r in roots:
        for form in (r, os.path.realpath(r), str(Path(r).absolute())):
            if form.rstrip("/"):
                out.add(form.rstrip("/"))
    return sorted(out, key=len, reverse=True)


def client_text(text: str | None, landing_roots: list[str]) -> str | None:
    """`text` without server paths: a landing location's prefix is dropped (what remains is the
    client's key), the location itself is called by name, and any other absolute path or file URL
    becomes `<server path>`."""
    if text is None:
        return None
    for root in landing_roots:
        for form in (f"file://{root}/", f"file:{root}/", f"{root}/"):  # followed by a key: the key
            text = re.sub(re.escape(form) + r"(?=[^\s'\"`,;)\]}>])", "", text)
        for form in (f"file://{root}/", f"file:{root}/", f"file://{root}", f"file:{root}", f"{root}/", root):
            text = text.replace(form, "the landing location")
    text = _FILE_URL.sub("<server path>", text)
    return _ABS_PATH.sub("<server path>", text)


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
