"""The `entity_raw` namespace: one Iceberg table per registered application, raw source rows as JSON.

Seed 000's design. `applications` metadata is the registry: `entity_raw.<application_id>` exists
for every enabled application, created proactively (at start-up and by a 10-minute schedule) and on
demand for a registered name; a load naming anything else is rejected with the list of valid
applications, so no arbitrary table can appear in the namespace.

A load request names file keys and/or glob patterns, a mode and the tenant. Every raw parquet row
becomes one entity_raw row: common columns (aligned with the transformed tables so that raw and
transformed rows join on connection_qualified_name, workflow_run_id and typename) plus the whole
row as `raw_record`, built by Spark's `to_json(struct(...))` over backtick-quoted column
references, so no column name can change the expression. Each load is one Iceberg commit on an
audit branch, carrying its file checkpoints in the snapshot summary, then published to main.

Modes: APPEND keeps every extraction (history, diffing between runs). UPSERT replaces, for the
request's tenant, the rows of each (connection_qualified_name, typename) the load contains with
the new rows: the table then holds the latest extraction per connection and typename. Delete and
append happen on the audit branch and reach main together in one fast-forward.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lakehouse.ingest.arrivals import requested_files
from lakehouse.ingest.checkpoints import Checkpoints
from lakehouse.ingest.files import CHECKPOINT_PROPERTY, EMPTY, PROCESSED, QUARANTINED, FileRef
from lakehouse.ingest.probe import probe_file
from lakehouse.ingest.s3 import ARRIVAL_TAG
from lakehouse.metadata.model import FileLimits, Stage, Target
from lakehouse.sources import adapter_for
from lakehouse.stage.core import Batch, DatasetDisabled, StageContext
from lakehouse.stage.wap_service import WriteAuditPublish, require_enabled
from lakehouse.table.iceberg import IcebergTables, quote, sql_string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.metadata.model import Application, MetadataCatalog, Source
    from lakehouse.platform import Platform

log = logging.getLogger(__name__)

NAMESPACE = "entity_raw"

#: (name, Spark/Iceberg type, required) in table order: exactly seed 000's schema.
SCHEMA: tuple[tuple[str, str, bool], ...] = (
    ("typename", "string", True),
    ("connection_qualified_name", "string", True),
    ("workflow_id", "string", True),
    ("workflow_run_id", "string", True),
    ("extracted_at", "bigint", True),  # epoch milliseconds
    ("tenant_id", "string", True),
    ("entity_name", "string", False),
    ("raw_record", "string", True),
)
COLUMNS = tuple(c for c, _, _ in SCHEMA)

#: Default layout of extraction output keys (the application SDK's):
#:   .../<workflow_id>/<workflow_run_id>/raw/<typename>/<file>.parquet
DEFAULT_KEY_PATTERN = r"(?:^|/)(?P<workflow_id>[^/]+)/(?P<workflow_run_id>[^/]+)/raw/(?P<typename>[^/]+)/[^/]+$"


class UnknownApplication(KeyError):
    """A name that is not a registered application: the message lists the valid ones."""

    def __str__(self) -> str:
        return self.args[0]


class LoadRequest(BaseModel):
    """One load into entity_raw.<application>; the shape of the MDLH `/load` request."""

    model_config = ConfigDict(extra="forbid")

    application: str
    tenant_id: str = Field(min_length=1)
    mode: Literal["APPEND", "UPSERT"] = "APPEND"
    file_keys: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list, description="glob patterns over keys, e.g. wf/*/raw/table/*.parquet")
    bucket: str | None = Field(default=None, description="defaults to the application's source bucket")
    typename: str | None = Field(default=None, description="else taken from the key layout")
    workflow_id: str | None = None
    workflow_run_id: str | None = None
    connection_qualified_name: str | None = None
    extracted_at: int | None = Field(default=None, description="epoch ms; default: load time")

    @field_validator("mode", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _needs_files(self) -> LoadRequest:
        if not self.file_keys and not self.patterns:
            raise ValueError("a load request needs at least one of file_keys or patterns")
        return self


@dataclass
class LoadResult:
    table: str
    run_id: str
    files_loaded: int = 0
    files_skipped: int = 0
    rows_written: int = 0
    snapshot_id: int | None = None
    quarantined: list[dict] = field(default_factory=list)
    empty_files: int = 0
    mode: str = "APPEND"
    typenames: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    records_quarantined: int = 0  # raw_record over the application's max_record_bytes
    skipped_reason: str | None = None  # a source/target kill switch stopped the load: nothing published
    checks: list = field(default_factory=list)  # the rules' outcomes (lakehouse.validation.rules.CheckOutcome)
    engine: str | None = None  # spark | arrow: what read the files and wrote the table (lakehouse.engines.choice)
    engine_reason: str | None = None

    def metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {"table": self.table, "mode": self.mode, "files_loaded": self.files_loaded,
                              "files_already_loaded": self.files_skipped, "rows_written": self.rows_written,
                              "snapshot_id": str(self.snapshot_id) if self.snapshot_id is not None else "none",
                              "typenames": ", ".join(self.typenames), "duration_s": round(self.duration_s, 3)}
        if self.quarantined:
            md["quarantined_files"] = len(self.quarantined)
            md["quarantined_file_errors"] = str(self.quarantined[:20])
        if self.empty_files:
            md["empty_files"] = self.empty_files
        if self.skipped_reason:
            md["skipped_reason"] = self.skipped_reason
        if self.engine:
            md["engine"], md["engine_reason"] = self.engine, self.engine_reason or ""
        if self.records_quarantined:
            md["records_quarantined"] = self.records_quarantined
            md["records_quarantined_in"] = self.table + "__quarantine"
        return md


# --------------------------------------------------------------------------- registry and tables


def table_identifier(application_id: str) -> str:
    return f"{NAMESPACE}.{application_id.lower()}"


def registered(catalog: MetadataCatalog) -> list[Application]:
    return [a for a in catalog.applications if a.enabled]


def require_application(catalog: MetadataCatalog, name: str) -> Application:
    apps = {a.application_id.lower(): a for a in registered(catalog)}
    app = apps.get((name or "").lower())
    if app is None:
        valid = ", ".join(sorted(apps)) or "(none registered)"
        raise UnknownApplication(
            f"unknown application {name!r}: entity_raw tables exist only for registered applications; "
            f"valid applications: {valid}. Register it in the `applications` metadata first.")
    return app


def iceberg_schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    types = {"string": StringType(), "bigint": LongType()}
    return Schema(*[NestedField(i, name, types[t], required=req) for i, (name, t, req) in enumerate(SCHEMA, 1)])


#: `partition_by_day`: the UTC day of extracted_at (epoch ms), as Iceberg truncate on the long column
DAY_MS = 86_400_000
DAY_FIELD = "extracted_day"


def _partition_spec(app: Application):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform, TruncateTransform

    fields = [PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="typename")]
    if app.partition_by_day:
        col = COLUMNS.index("extracted_at") + 1  # field ids follow SCHEMA's order (iceberg_schema)
        fields.append(PartitionField(source_id=col, field_id=1001, transform=TruncateTransform(DAY_MS), name=DAY_FIELD))
    return PartitionSpec(*fields)


def _evolve_partitioning(platform: Platform, app: Application, ident: str) -> None:
    """An application that turned `partition_by_day` on: add the day field to its existing table
    (Iceberg partition evolution: older files keep their layout, new ones get the day)."""
    if not app.partition_by_day:
        return
    table = platform.pyiceberg_catalog().load_table(ident)
    col = table.schema().find_field("extracted_at").field_id
    if any(f.source_id == col and str(f.transform) == f"truncate[{DAY_MS}]" for f in table.spec().fields):
        return
    from lakehouse.runtime import spark as spark_mod

    if spark_mod._SESSION is not None:
        tables = platform.tables()
        platform.spark().sql(f"ALTER TABLE {tables.qualified(ident)} ADD PARTITION FIELD "
                             f"truncate({DAY_MS}, {quote('extracted_at')}) AS {quote(DAY_FIELD)}")
    else:
        from pyiceberg.transforms import TruncateTransform

        with table.update_spec() as spec:
            spec.add_field("extracted_at", TruncateTransform(DAY_MS), DAY_FIELD)
    log.info("%s: now partitioned by typename and the day of extracted_at", ident)


def ensure_table(platform: Platform, application_id: str, catalog: MetadataCatalog | None = None) -> bool:
    """Create entity_raw.<app> (registered apps only) with PyIceberg: no Spark needed. True if created."""
    from pyiceberg.exceptions import TableAlreadyExistsError

    from lakehouse.table.catalog import ensure_namespace

    app = require_application(catalog or platform.catalog(), application_id)
    ident = table_identifier(app.application_id)
    from lakehouse.runtime import spark as spark_mod

    if spark_mod._SESSION is not None:
        # a JVM is already up in this process: create through its catalog connection, since a second
        # writer (PyIceberg) on an embedded SQLite catalog can find the database locked
        return _ensure_table_spark(platform, app, ident)
    cat = platform.pyiceberg_catalog()
    ensure_namespace(cat, NAMESPACE)  # another load creating it at the same moment is fine
    if cat.table_exists(ident):
        _evolve_partitioning(platform, app, ident)
        return False
    spec = _partition_spec(app)
    try:
        cat.create_table(ident, schema=iceberg_schema(), partition_spec=spec,
                         properties={"format-version": "2", "write.wap.enabled": "true",
                                     "comment": f"raw extraction records of application {app.application_id}"})
    except TableAlreadyExistsError:
        return False
    log.info("created %s for registered application %s", ident, app.application_id)
    return True


def _ensure_table_spark(platform: Platform, app: Application, ident: str) -> bool:
    tables = platform.tables()
    if tables.exists(ident):
        _evolve_partitioning(platform, app, ident)
        return False
    tables.ensure_namespace(NAMESPACE)
    cols = ", ".join(f"{quote(c)} {t}{' NOT NULL' if req else ''}" for c, t, req in SCHEMA)
    props = {"format-version": "2", "write.wap.enabled": "true",
             "comment": f"raw extraction records of application {app.application_id}"}
    platform.spark().sql(
        f"CREATE TABLE IF NOT EXISTS {tables.qualified(ident)} ({cols}) USING iceberg "
        f"PARTITIONED BY ({quote('typename')}) TBLPROPERTIES ("
        + ", ".join(f"{sql_string(k)}={sql_string(v)}" for k, v in props.items()) + ")")
    _evolve_partitioning(platform, app, ident)  # Spark's CREATE cannot name the day field: add it named
    log.info("created %s for registered application %s", ident, app.application_id)
    return True


def ensure_all_tables(platform: Platform) -> list[str]:
    """Proactive creation for every registered application (start-up and the 10-minute schedule)."""
    catalog = platform.catalog()
    created = [table_identifier(a.application_id) for a in registered(catalog)
               if ensure_table(platform, a.application_id, catalog)]
    if created:
        platform.store.audit(event="entity_raw_tables_created", outcome="success", message=", ".join(created))
    return created


# --------------------------------------------------------------------------- rows


def parse_key(key: str, pattern: str = DEFAULT_KEY_PATTERN) -> dict[str, str]:
    m = re.search(pattern, key)
    return {k: v for k, v in m.groupdict().items() if v} if m else {}


def to_entity_raw(df: DataFrame, *, typename: str, connection_qualified_name: str, workflow_id: str,
                  workflow_run_id: str, extracted_at: int, tenant_id: str,
                  entity_name_field: str | None, passthrough: tuple[str, ...] = ()) -> DataFrame:
    """Raw rows -> entity_raw rows. Column references are backtick-quoted (`quote`), never pasted.
    `passthrough` columns (row provenance) are carried along, not put in raw_record."""
    from pyspark.sql import functions as F

    cols = [c for c in df.columns if c not in passthrough]
    record = F.to_json(F.struct(*[F.col(quote(c)).alias(c) for c in cols]))
    name_col = (F.col(quote(entity_name_field)).cast("string") if entity_name_field and entity_name_field in cols
                else F.lit(None).cast("string"))
    return df.select(
        F.lit(typename).alias("typename"),
        F.lit(connection_qualified_name).alias("connection_qualified_name"),
        F.lit(workflow_id).alias("workflow_id"),
        F.lit(workflow_run_id).alias("workflow_run_id"),
        F.lit(int(extracted_at)).cast("bigint").alias("extracted_at"),
        F.lit(tenant_id).alias("tenant_id"),
        name_col.alias("entity_name"),
        F.coalesce(record, F.lit("{}")).alias("raw_record"),  # never null: the column is required
        *[F.col(quote(c)) for c in passthrough],
    )


# --------------------------------------------------------------------------- files


def _app_source(catalog: MetadataCatalog, app: Application) -> Source | None:
    return next((s for s in catalog.sources if s.source_id == app.source_id), None) if app.source_id else None


def resolve_files(platform: Platform, src: Source | None, request: LoadRequest) -> tuple[list[FileRef], str]:
    """(files named by keys or matched by patterns, location prefix for checkpoints), found by the
    entity_raw source adapter in the application's landing directory or bucket."""
    return adapter_for("entity_raw").find_files(platform, src, request.file_keys, request.patterns,
                                                f"load request for {request.application!r}", request.bucket)


# --------------------------------------------------------------------------- load


def load(platform: Platform, request: LoadRequest | dict, run_id: str | None = None) -> LoadResult:
    """Validate, create on demand, stage, convert (with Spark, or with pyarrow when the engine
    choice says Arrow: no JVM), commit once on a branch, publish."""
    t0 = time.monotonic()
    request = request if isinstance(request, LoadRequest) else LoadRequest.model_validate(request)
    run_id = run_id or uuid.uuid4().hex
    catalog = platform.catalog()
    app = require_application(catalog, request.application)
    ident = table_identifier(app.application_id)
    ensure_table(platform, app.application_id, catalog)  # on demand, for a registered name
    src = _app_source(catalog, app)
    result = LoadResult(ident, run_id, mode=request.mode)
    files, location = resolve_files(platform, src, request)
    if not files:
        raise FileNotFoundError(f"load request for {request.application!r}: no file matches "
                                f"file_keys={request.file_keys} patterns={request.patterns} in {location}")
    pattern = (src.options.get("key_pattern") if src is not None else None) or DEFAULT_KEY_PATTERN
    # checkpoint identity: tenant + location + key, so two tenants never shadow each other's files
    ck = {f.key: f"{request.tenant_id}|{location}{f.key}" for f in files}
    tables = platform.tables()
    since = tables.snapshot_id(ident)  # main as planned: the publish checks every later commit
    cp = Checkpoints(platform, ident)
    cp.sync(tables)
    done = cp.handled([FileRef(ck[f.key], f.size, f.etag) for f in files])
    new = [f for f in files if (ck[f.key], f.etag) not in done]
    result.files_skipped = len(files) - len(new)
    if not new:
        result.duration_s = time.monotonic() - t0
        return result

    # per-file context (typename, workflow ids) before any I/O: a bad key layout fails fast
    contexts: dict[str, dict[str, Any]] = {}
    for f in new:
        parsed = parse_key(f.key, pattern)
        ctx = {"typename": request.typename or parsed.get("typename"),
               "workflow_id": request.workflow_id or parsed.get("workflow_id"),
               "workflow_run_id": request.workflow_run_id or parsed.get("workflow_run_id"),
               "connection_qualified_name": request.connection_qualified_name
               or (src.options.get("connection_qualified_name") if src is not None else None)}
        missing = [k for k, v in ctx.items() if not v]
        if missing:
            raise ValueError(f"load request for {request.application!r}: cannot tell {', '.join(missing)} for "
                             f"{f.key!r}; give them in the request or match the key layout {pattern!r}")
        contexts[f.key] = ctx

    new, staging = adapter_for("entity_raw").stage_files(platform, src, new, location, run_id, f"entity_raw {ident}")
    checked: list[FileRef] = []
    footer: dict[str, str] = {}  # key -> its footer schema: files of different schemas are read apart
    for f in new:
        if f.size == 0:
            checked.append(f.with_status(EMPTY))
            continue
        probed = probe_file(f.local_path or f.key, "parquet", limits=src.limits if src is not None else FileLimits())
        footer[f.key] = probed.read_key
        checked.append(f if probed.status == PROCESSED else f.with_status(probed.status, probed.error))
    unread = [f for f in checked if f.status != PROCESSED]
    for f in unread:
        if f.status == QUARANTINED:
            result.quarantined.append({"key": f.key, "error": f.error})
            platform.store.audit(run_id=run_id, dataset=ident, event="file_quarantined", error_class="UnreadableFile",
                                 outcome="quarantined", message=f"{f.key}: {f.error}",
                                 details={"key": f.key, "etag": f.etag, "application": app.application_id})
        else:
            result.empty_files += 1
    cp.record(_ck_rows(unread, ck, run_id))
    good = [f for f in checked if f.status == PROCESSED]
    extracted_at = request.extracted_at or int(time.time() * 1000)
    groups: dict[tuple, list[FileRef]] = {}
    for f in good:
        c = contexts[f.key]
        groups.setdefault((c["typename"], c["workflow_id"], c["workflow_run_id"], c["connection_qualified_name"]),
                          []).append(f)
    from lakehouse.engines import choice as engine_choice

    rules = catalog.rule_set(app.validation_set_id).rules if app.validation_set_id else []
    choice = engine_choice.choose_for_application(catalog, app, rules, sum(f.size for f in good))
    result.engine, result.engine_reason = choice.engine, choice.reason
    if choice.engine == "arrow":
        superseded = _load_arrow(platform, app, request, catalog, groups, good, checked, ck, result, since,
                                 extracted_at, choice)
        return _finish(platform, request, run_id, ident, superseded, result, staging, good, cp, tables, t0)
    spark = platform.spark()
    frames = []
    from lakehouse.stage import entity_raw_cap

    for (typename, wf, wfr, cqn), fs in sorted(groups.items()):
        same_schema: dict[str, list[FileRef]] = {}
        for f in fs:  # Spark reads one schema per read: a file with other columns would lose them
            same_schema.setdefault(footer[f.key], []).append(f)
        for part in same_schema.values():
            raw = entity_raw_cap.with_provenance(spark.read.parquet(*[f.local_path for f in part]))
            frames.append(to_entity_raw(
                raw, typename=typename, connection_qualified_name=cqn, workflow_id=wf, workflow_run_id=wfr,
                extracted_at=extracted_at, tenant_id=request.tenant_id,
                entity_name_field=app.entity_name_fields.get(typename.lower()),
                passthrough=entity_raw_cap.PROVENANCE))
    result.typenames = sorted({g[0] for g in groups})
    if frames:
        df = frames[0]
        for other in frames[1:]:
            df = df.unionByName(other)
        cached = df.persist()  # the size check and the write share one read of the files
        try:
            df, result.records_quarantined = entity_raw_cap.apply_cap(platform, ident, cached, good,
                                                                      app.max_record_bytes, run_id)
            superseded = _commit(platform, write_context(platform, app, run_id, catalog), df, request, groups,
                                 checked, ck, result, since)
        finally:
            cached.unpersist()
    else:
        superseded = None
    return _finish(platform, request, run_id, ident, superseded, result, staging, good if frames else [], cp, tables, t0)


def _load_arrow(platform: Platform, app: Application, request: LoadRequest, catalog: MetadataCatalog, groups: dict,
                good: list[FileRef], checked: list[FileRef], ck: dict[str, str], result: LoadResult, since,
                extracted_at: int, choice):
    """The files to entity_raw rows with pyarrow, capped, committed by the Arrow engine (no JVM)."""
    import pyarrow as pa

    from lakehouse.engines import engine_for
    from lakehouse.engines.arrow import entity_raw as entity_raw_arrow

    parts = []
    for (typename, wf, wfr, cqn), fs in sorted(groups.items()):
        for raw in entity_raw_arrow.read_raw(fs):
            parts.append(entity_raw_arrow.to_entity_raw(
                raw, typename=typename, connection_qualified_name=cqn, workflow_id=wf, workflow_run_id=wfr,
                extracted_at=extracted_at, tenant_id=request.tenant_id,
                entity_name_field=app.entity_name_fields.get(typename.lower())))
    result.typenames = sorted({g[0] for g in groups})
    if not parts:
        return None
    ident = table_identifier(app.application_id)
    table, result.records_quarantined = entity_raw_arrow.apply_cap(platform, ident, pa.concat_tables(parts), good,
                                                                   app.max_record_bytes, result.run_id)
    ctx = write_context(platform, app, result.run_id, catalog)
    return _commit(platform, ctx, table, request, groups, checked, ck, result, since, engine=engine_for(choice))


def _finish(platform: Platform, request: LoadRequest, run_id: str, ident: str, superseded, result: LoadResult,
            staging, loaded: list[FileRef], cp: Checkpoints, tables: IcebergTables, t0: float) -> LoadResult:
    if superseded is not None:  # another run loaded some of these files first: load only the rest
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        return _load_rest(platform, request, run_id, ident, superseded, result)
    if loaded and result.skipped_reason is None:
        result.files_loaded = len(loaded)
    cp.sync(tables)
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    result.duration_s = time.monotonic() - t0
    platform.store.audit(run_id=run_id, dataset=ident, event="entity_raw_load", outcome="success",
                         duration_ms=int(result.duration_s * 1000),
                         details={k: v for k, v in result.metadata().items() if k != "quarantined_file_errors"})
    return result


def _ck_rows(files: list[FileRef], ck: dict[str, str], run_id: str):
    from lakehouse.ingest.checkpoints import CheckpointRow

    return [CheckpointRow(ck[f.key], f.etag, f.size, f.status, run_id, None, f.error) for f in files]


def _load_rest(platform: Platform, request: LoadRequest, run_id: str, ident: str, superseded, first: LoadResult
               ) -> LoadResult:
    """Plan and load again from the current main: only what nobody has loaded is left."""
    msg = superseded.overlap.message() if superseded.overlap else "main moved under an UPSERT"
    log.warning("entity_raw %s: %s; loading the rest", ident, msg)
    platform.store.audit(run_id=run_id, dataset=ident, event="already_loaded", outcome="skipped", message=msg,
                         details=superseded.overlap.details() if superseded.overlap else {})
    rest = load(platform, request, run_id=run_id)
    rest.quarantined = first.quarantined + rest.quarantined
    rest.empty_files += first.empty_files
    return rest


def write_context(platform: Platform, app: Application, run_id: str, catalog: MetadataCatalog | None = None
                  ) -> StageContext:
    """The write-audit-publish context of a load into entity_raw.<app>: the application's source
    and rule set (`validation_set_id`), its table as the target (append; UPSERT replaces on the branch)."""
    ident = table_identifier(app.application_id)
    # not a metadata row (an application may have no source: loads name their files): built unvalidated
    stage = Stage.model_construct(pipeline_id=NAMESPACE, stage_order=1, stage_name=app.application_id.lower(),
                                  layer="entity_raw", source_id=app.source_id, target_id=ident,
                                  validation_set_id=app.validation_set_id)
    target = Target(target_id=ident, namespace=NAMESPACE, table=app.application_id.lower(), write_mode="append")
    ctx = StageContext.for_write(platform, stage, target, run_id, log, catalog=catalog)
    ctx.adapter_for = adapter_for
    return ctx


def _upsert_delete(ident: str, request: LoadRequest, groups: dict) -> Callable[[IcebergTables, str], None]:
    """UPSERT: on the audit branch, before the new rows, delete the tenant's rows of every
    (connection_qualified_name, typename) the load contains; both reach main in one publish."""
    pairs = sorted({(g[3], g[0]) for g in groups})
    cond = " OR ".join(
        f"({quote('connection_qualified_name')} = {sql_string(c)} AND {quote('typename')} = {sql_string(t)})"
        for c, t in pairs)

    def delete(tables: IcebergTables, branch: str) -> None:
        tables.spark.sql(f"DELETE FROM {tables.qualified(ident, branch)} "
                         f"WHERE {quote('tenant_id')} = {sql_string(request.tenant_id)} AND ({cond})")
    return delete


def _commit(platform: Platform, ctx: StageContext, df: DataFrame, request: LoadRequest, groups: dict,
            checked: list[FileRef], ck: dict[str, str], result: LoadResult, since: int | None = None, engine=None):
    """One commit on the run's branch through the write-audit-publish service (rules, kill switch,
    healing, throttle, exactly-once publish). Returns the PublishResult when nothing was published
    (input already on main, or main moved under an UPSERT)."""
    import json

    from lakehouse.runtime import coordination
    from lakehouse.table.publish import Superseded

    ident, run_id = ctx.target.identifier, ctx.run_id
    arrow = engine is not None and engine.name == "arrow"
    delete = None
    if request.mode == "UPSERT":
        if arrow:
            from lakehouse.engines.arrow import entity_raw as entity_raw_arrow

            delete = entity_raw_arrow.upsert_delete(ident, request.tenant_id, sorted({(g[3], g[0]) for g in groups}))
        else:
            delete = _upsert_delete(ident, request, groups)
    wap = WriteAuditPublish(ctx, prepare_branch=delete, engine=engine)
    props = {CHECKPOINT_PROPERTY: json.dumps([{**f.as_checkpoint(), "key": ck[f.key]} for f in checked],
                                             separators=(",", ":")),
             "lakehouse.run_id": run_id, "lakehouse.tenant_id": request.tenant_id, "lakehouse.mode": request.mode}
    try:
        require_enabled(ctx, "before load")
        wap.tidy_branches(wap.engine.tables(platform))  # what dead loads left behind
        wap.drop_own_branches()  # a retry of this load: start over
        outcome = wap.run([Batch(df, props, label=f"{request.mode.lower()} {len(checked)} file(s)")], since=since)
        result.rows_written, result.snapshot_id, result.checks = outcome.rows_written, outcome.snapshot_id, outcome.checks
    except Superseded as sup:
        wap.drop_own_branches()
        return sup.result
    except DatasetDisabled as exc:  # switched off (before or during the load): nothing reaches main
        result.skipped_reason = wap.skip_disabled(str(exc)).skipped_reason
    finally:
        coordination.release_lease(platform, run_id, ident)
    return None


# --------------------------------------------------------------------------- arrivals


def load_new_files(platform: Platform, application_id: str, run_id: str, run_tags: dict | None = None) -> LoadResult:
    """What the entity_raw asset does: load the sensor's batch (run tag) or every new file of the
    application's source, with tenant / connection / mode from the source's options."""
    catalog = platform.catalog()
    app = require_application(catalog, application_id)
    src = _app_source(catalog, app)
    if src is None:
        raise ValueError(f"application {app.application_id!r} has no source_id: nothing to watch or load")
    tenant = src.options.get("tenant_id")
    if not tenant:
        raise ValueError(f"source {src.source_id!r} of application {app.application_id!r} needs options.tenant_id")
    batch = (run_tags or {}).get(ARRIVAL_TAG)
    if batch:
        keys = [f.key for f in requested_files(platform, batch)]
    else:
        keys = [f.key for f in adapter_for("entity_raw").list_files(platform, src)]
    ident = table_identifier(app.application_id)
    if not keys:
        return LoadResult(ident, run_id)
    req = LoadRequest(application=app.application_id, tenant_id=tenant, file_keys=keys,
                      mode=src.options.get("mode", "APPEND").upper(),
                      connection_qualified_name=src.options.get("connection_qualified_name"))
    return load(platform, req, run_id=run_id)


def ensure_tables_at_startup(platform: Platform) -> None:
    """Called when the code location loads; never blocks start-up on a catalog problem."""
    try:
        ensure_all_tables(platform)
    except Exception:  # noqa: BLE001 - logged; the schedule retries every 10 minutes
        log.warning("could not create entity_raw tables at start-up", exc_info=True)


def staging_root(platform: Platform) -> Path:
    return platform.settings.staging_dir / "entity_raw"
