"""The typed metadata model: the one source of truth for what the platform does.

Tables follow the seed design (pipelines, stages, sources, targets, validation_rules,
control_flags, retry_policies, healing_actions, profiles, throttles, lineage, applications,
audit_log). Structural entities build the asset graph; operational entities (flags,
throttles, profiles, retry and healing rules) are read at run time from the control DB.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

# Identifiers end up in Iceberg table names, Dagster keys and pool names: keep them boring.
IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}$")

# The code location of every pipeline without `code_location` (workspace.yaml's one entry, `defs`).
DEFAULT_CODE_LOCATION = "lakehouse"

Layer = Literal["bronze", "silver", "gold", "entity_raw"]
LAYERS: tuple[str, ...] = ("bronze", "silver", "gold", "entity_raw")


def check_ident(value: str, what: str) -> str:
    if not IDENT_RE.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid identifier "
            "(letters, digits and '_', starting with a letter or '_', at most 128 chars)"
        )
    return value


#: what SQL injection through a quoted identifier needs: to close the quote, end the statement or
#: comment out the rest (and control characters, which no name needs)
_HOSTILE_IN_NAME = re.compile(r"[`'\"\\;\x00-\x1f\x7f]|--|/\*|\*/")


def check_column(value: str, what: str) -> str:
    """A column name from metadata (a merge key, a rule's column, a declared column). Names that
    databases and files carry stay valid — spaces, parentheses, commas, '=' (the platform quotes every
    name it puts in SQL) — but not a quote character, ';', a comment marker or a control character,
    which no real column needs and which only serve to break out of a quoted name."""
    if not value or value != value.strip() or len(value) > 255:
        raise ValueError(f"{what} {value!r} is not a column name (empty, at most 255 characters, no leading or "
                         "trailing space)")
    bad = _HOSTILE_IN_NAME.search(value)
    if bad:
        raise ValueError(f"{what} {value!r} is not a column name the platform accepts: it contains "
                         f"{bad.group()!r} (quotes, backslash, ';', '--', '/*', '*/' and control characters are "
                         "refused in column names)")
    return value


def check_columns(values: list[str], what: str) -> list[str]:
    return [check_column(v, f"{what}[{i}]") for i, v in enumerate(values)]


def check_id(value: str, what: str = "id") -> str:
    if not ID_RE.match(value):
        raise ValueError(f"{what} {value!r} may only contain letters, digits, '_', '.', ':' and '-'")
    return value


class Entity(BaseModel):
    """Base of every metadata row: unknown fields are errors, so typos never pass silently."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Subclasses name their primary key fields; the loader and the store use it for merge-by-key.
    __key__: tuple[str, ...] = ()

    def key(self) -> tuple:
        return tuple(getattr(self, f) for f in self.__key__)


# --------------------------------------------------------------------------- pipelines


class Pipeline(Entity):
    __key__ = ("pipeline_id",)

    pipeline_id: str
    description: str = ""
    owner: str | None = None
    enabled: bool = True
    criticality: Literal["critical", "high", "normal", "low"] = "normal"
    default_retry_id: str | None = None
    schedule: str | None = Field(default=None, description="cron expression for the pipeline's schedule")
    timezone: str = "UTC"
    tags: dict[str, str] = Field(default_factory=dict)
    code_location: str | None = Field(
        default=None, description="the Dagster code location serving this pipeline's assets, sensors and schedules "
        f"(an identifier; unset: the default location {DEFAULT_CODE_LOCATION!r}). Splitting 1,000 pipelines over "
        "several locations lets a reload rebuild only the changed one; `lakehouse workspace` writes the "
        "workspace.yaml naming every location (docs/operations.md)")

    _v_id = field_validator("pipeline_id")(lambda cls, v: check_ident(v, "pipeline_id"))

    @field_validator("code_location")
    @classmethod
    def _location(cls, v: str | None, info: ValidationInfo) -> str | None:
        # the name becomes a workspace entry and a module attribute: an identifier, said with its pipeline
        return None if v is None else check_ident(v, f"code_location of pipeline {info.data.get('pipeline_id')!r}:")

    @property
    def location(self) -> str:
        """The code location serving this pipeline (the default one when unset)."""
        return self.code_location or DEFAULT_CODE_LOCATION

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is not None and len(v.split()) not in (5, 6):
            raise ValueError(f"schedule {v!r} is not a cron expression (5 or 6 fields)")
        return v


class Incremental(BaseModel):
    """An incremental stage (lakehouse.stage.incremental): each run reads only what its upstream table (the
    one named by `upstream` when the SQL reads several) committed since the upstream snapshot it last consumed (recorded in the target's snapshot
    summary, in the same commit as the data), and writes by merge or by replacing the partitions
    that input touched; anything it cannot read incrementally falls back to a full recompute."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["merge", "partitions"] = Field(
        description="merge: the SQL runs over the rows appended upstream since the last run and its output is "
        "merged into the target on merge_keys; partitions: the partitions (values of partition_column) the "
        "upstream changes touched are recomputed from their upstream rows in full and replace those partitions")
    merge_keys: list[str] = Field(default_factory=list, description="merge: the output columns identifying a row")
    order_by: str | None = Field(
        default=None, description="merge: the output column telling which of two rows with one key is newer "
        "(the higher wins: in the change set, against the target, in a full recompute); unset: the later-appended "
        "row wins "
        "and the SQL must output one row per key")
    partition_column: str | None = Field(
        default=None, description="partitions: the output column the target is identity-partitioned by")
    upstream_partition: str | None = Field(
        default=None, description="partitions: a Spark SQL expression over an upstream row giving the "
        "partition_column value of the output rows it contributes to, e.g. CAST(event_ts AS DATE) "
        "(default: the upstream column named like partition_column)")
    upstream: str | None = Field(
        default=None, description="the upstream table (namespace.table) read incrementally when the SQL reads "
        "more than one (e.g. events joined to a dimension); the others are read in full, their snapshots are "
        "recorded too, and a run finding any of them changed since recomputes in full and says so")

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = v.split(".")
        if len(parts) != 2:
            raise ValueError(f"upstream {v!r} must be namespace.table")
        return ".".join(check_ident(p, "upstream part") for p in parts).lower()

    @field_validator("merge_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        return [check_ident(k, "merge_keys entry") for k in v]

    _v_order = field_validator("order_by", "partition_column")(
        lambda cls, v: v if v is None else check_ident(v, "column"))

    @model_validator(mode="after")
    def _mode_fields(self) -> Incremental:
        if self.mode == "merge":
            if not self.merge_keys:
                raise ValueError("incremental mode merge needs merge_keys (the output columns identifying a row)")
            if self.partition_column or self.upstream_partition:
                raise ValueError("partition_column / upstream_partition belong to incremental mode partitions, "
                                 "not merge")
        else:
            if not self.partition_column:
                raise ValueError("incremental mode partitions needs partition_column (the output column the "
                                 "target is identity-partitioned by)")
            if self.merge_keys or self.order_by:
                raise ValueError("merge_keys / order_by belong to incremental mode merge, not partitions")
        return self


class PythonTransformation(BaseModel):
    """A stage whose table is computed by a Python function instead of SQL.

    `function` is `package.module:function`: called with one argument, a mapping of table
    identifier -> Spark DataFrame of each table in `inputs` (read at the snapshots the run pinned),
    it returns one DataFrame, written through the same write-audit-publish and rules as SQL stages.
    """

    model_config = ConfigDict(extra="forbid")
    function: str = Field(description="package.module:function, importable where the platform runs")
    inputs: list[str] = Field(default_factory=list, description="lake tables (namespace.table) handed to the function")

    @field_validator("function")
    @classmethod
    def _reference(cls, v: str) -> str:
        module, _, name = v.partition(":")
        if not (module and name and all(p.isidentifier() for p in module.split(".")) and name.isidentifier()):
            raise ValueError(f"python transformation {v!r} must be `package.module:function`")
        return v


class Stage(Entity):
    __key__ = ("pipeline_id", "stage_order")

    pipeline_id: str
    stage_order: int = Field(ge=1)
    stage_name: str
    layer: Layer
    source_id: str | None = Field(
        default=None,
        description="where the stage reads; for SQL stages the upstream tables are derived from the SQL",
    )
    target_id: str
    transformation: str | None = Field(default=None, description="Spark SQL SELECT producing the target")
    transformation_file: str | None = Field(default=None, description="path of a .sql file, relative to the metadata file")
    python_transformation: PythonTransformation | None = Field(
        default=None, description="a Python function computing the table (YAML: `transformation: {python: "
        "package.module:function, inputs: [namespace.table, ...]}`)")
    validation_set_id: str | None = None
    retry_id: str | None = None
    enabled: bool = True
    description: str = ""
    owner: str | None = None
    timeout_seconds: int | None = Field(
        default=None, ge=1,
        description="a step whose Spark work runs longer is cancelled and fails; default: derived from the "
        "stage's past durations in audit_log, at most platform setting step_timeout.ceiling_seconds",
    )
    incremental: Incremental | None = Field(
        default=None, description="read only what the upstream committed since the last run (SQL stages over "
        "one upstream table, or several naming the one read incrementally, whose target has write_mode "
        "overwrite, what a full recompute does)")

    sql_engine: Literal["spark", "duckdb"] = Field(
        default="spark", description="where a SQL stage's SELECT runs: spark, or duckdb over the pinned "
        "upstream snapshots read into memory through PyIceberg/Arrow, for small upstreams (lakehouse.sources."
        "duckdb_sql; no incremental block; the SQL must transpile from Spark SQL), written through the same "
        "write-audit-publish; by PyIceberg without a JVM when the target's engine is arrow or a small auto")

    _v_name = field_validator("stage_name")(lambda cls, v: check_ident(v, "stage_name"))

    @model_validator(mode="before")
    @classmethod
    def _python_form(cls, data: Any) -> Any:
        """`transformation: {python: pkg.mod:fn, inputs: [...]}` is the Python stage's YAML form."""
        if isinstance(data, dict) and isinstance(data.get("transformation"), dict):
            data = dict(data)
            spec = dict(data.pop("transformation"))
            if "python" not in spec:
                raise ValueError("a mapping under `transformation` needs `python: package.module:function`")
            data["python_transformation"] = {"function": spec.pop("python"), **spec}
        return data

    @model_validator(mode="after")
    def _one_transformation(self) -> Stage:
        if sum(bool(x) for x in (self.transformation, self.transformation_file, self.python_transformation)) > 1:
            raise ValueError("give one of transformation (SQL or python), transformation_file")
        if self.layer in ("bronze", "entity_raw") and not self.source_id:
            raise ValueError(f"a {self.layer} stage needs a source_id")
        if self.sql_engine == "duckdb" and not (self.transformation or self.transformation_file):
            raise ValueError("sql_engine: duckdb runs a SQL transformation: give transformation or transformation_file")
        if self.sql_engine == "duckdb" and self.incremental is not None:
            raise ValueError("sql_engine: duckdb does not read incremental change sets yet: drop `incremental` "
                             "or run the stage on spark")
        if self.layer in ("silver", "gold") and not (self.transformation or self.transformation_file
                                                     or self.python_transformation or self.source_id):
            raise ValueError(f"a {self.layer} stage needs a transformation, a transformation_file or a source_id")
        return self


# --------------------------------------------------------------------------- sources / targets


class ColumnSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    type: str = Field(description="Spark SQL type, e.g. string, bigint, timestamp, decimal(10,2)")
    nullable: bool = True
    doc: str | None = None

    _v_name = field_validator("name")(lambda cls, v: check_column(v, "column name"))

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        from lakehouse.metadata.spark_types import type_problem  # the ingestion's own grammar

        problem = type_problem(v)
        if problem:
            raise ValueError(f"{problem}: a Spark SQL type, e.g. string, bigint, decimal(10,2), array<string>")
        return v


class FileLimits(BaseModel):
    """Checked while probing each landing file, before Spark reads it; a file over a limit is
    quarantined with the limit named. The defaults are far above what real feeds produce."""

    model_config = ConfigDict(extra="forbid")
    max_depth: int = Field(default=64, ge=1, description="nesting depth of objects/arrays (JSON) or structs/lists (parquet)")
    max_field_chars: int = Field(
        default=16 * 1024**2, ge=1,
        description="characters in one value; Spark's JSON parser refuses strings over 20,000,000 whatever this says",
    )
    max_line_bytes: int = Field(default=64 * 1024**2, ge=1, description="bytes in one JSON line or CSV record")
    max_columns: int = Field(default=10_000, ge=1, description="fields in a file's schema, nested ones included")


class PromoteField(BaseModel):
    """Copies a nested struct field to a top-level column (predicate pushdown works on top level only)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="dotted path into a struct, e.g. extra.workflow_name")
    column: str

    _v_col = field_validator("column")(lambda cls, v: check_ident(v, "column"))


DATE_PLACEHOLDERS = ("{yyyy}", "{mm}", "{dd}")


def dated_layout_problem(layout: str) -> str | None:
    """Why a `dated_layout` template cannot name one day's prefix (None: it can)."""
    unknown = set(re.findall(r"\{[^}]*\}", layout)) - set(DATE_PLACEHOLDERS)
    if unknown:
        return f"unknown placeholder(s) {sorted(unknown)}: only {{yyyy}}, {{mm}} and {{dd}}"
    missing = [p for p in DATE_PLACEHOLDERS if p not in layout]
    if missing:
        return f"missing {missing}: a day's prefix needs {{yyyy}}, {{mm}} and {{dd}}"
    if layout.startswith("/") or ".." in layout.split("/"):
        return "must be relative to the source's path/prefix, without '..'"
    return None


class PathColumn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the key of a Hive-style `name=value` directory segment, and the column's name")
    type: Literal["int", "bigint", "string", "date"] = "string"

    _v_name = field_validator("name")(lambda cls, v: check_ident(v, "path_columns name"))


class Source(Entity):
    __key__ = ("source_id",)

    source_id: str
    kind: Literal["files", "s3", "jdbc", "iceberg"]
    description: str = ""
    # files / s3
    format: Literal["parquet", "csv", "jsonl"] | None = None
    path: str | None = Field(default=None, description="landing directory for kind=files, relative to LAKEHOUSE_LANDING_DIR (default LAKEHOUSE_HOME/landing)")
    bucket: str | None = None
    prefix: str = ""
    glob: str = "*"
    endpoint_url: str | None = Field(default=None, description="S3 endpoint; env LAKEHOUSE_S3_ENDPOINT_URL overrides")
    read_mode: Literal["stage", "direct"] = Field(
        default="stage", description="stage: download with boto3 then read; direct: Spark reads s3a:// itself"
    )
    csv_header: bool = True
    dated_layout: str | None = Field(
        default=None,
        description="files/s3: where one day's files are under path/prefix, a template of {yyyy}, {mm} and {dd} "
        "(e.g. year={yyyy}/month={mm}/day={dd}); `lakehouse ingest SOURCE --date D` loads that day's prefix only",
    )
    path_columns: list[PathColumn] = Field(
        default_factory=list,
        description="files/s3: Hive-style `name=value` path segments that become typed columns of every row "
        "(null when a file's key has no such segment)",
    )
    columns: list[ColumnSpec] = Field(
        default_factory=list,
        description="declared columns: their types are what files are read as (matched by name); other columns "
        "follow the schema policy; empty = each file's own schema",
    )
    limits: FileLimits = Field(default_factory=FileLimits, description="per-file limits checked before Spark")
    promote_fields: list[PromoteField] = Field(default_factory=list)
    batch_files: int = Field(default=100, ge=1, description="at most this many files per Iceberg commit")
    batch_bytes: int = Field(
        default=256 * 1024**2, ge=1,
        description="at most this many bytes of input per Iceberg commit (a larger file is a commit of its own): "
        "a small landing is one commit, a large one still commits (and checkpoints) every batch_bytes",
    )
    max_files_per_run: int = Field(default=1000, ge=1)
    max_bytes_per_run: int = Field(default=10 * 1024**3, ge=1)
    download_threads: int = Field(default=8, ge=1, le=64)
    lineage_columns: bool = Field(
        default=True,
        description="add `_source_file` (the file each row came from) and `_ingested_at` to every row; "
        "two more columns to encode cost about 25% of a plain append's time",
    )
    # jdbc
    jdbc_url: str | None = None
    jdbc_url_env: str | None = Field(default=None, description="env var holding the JDBC URL (takes precedence)")
    driver: str | None = None
    table: str | None = None
    query: str | None = None
    user_env: str | None = None
    password_env: str | None = None
    load_type: Literal["full", "incremental"] = "full"
    partitioned: bool = False
    primary_key: list[str] = Field(default_factory=list)
    watermark_column: str | None = None
    watermark_type: Literal["int", "date", "timestamp"] | None = None
    partition_column: str | None = None
    partition_size_rows: int = Field(default=1_000_000, ge=1)
    max_partitions: int = Field(default=64, ge=1)
    fetchsize: int = Field(default=10_000, ge=1)
    max_parallel_queries: int | None = Field(
        default=None, ge=1,
        description="partitioned jdbc: at most this many partition queries open against the source at once "
        "(the partitions are read in waves of this many, each wave one Spark JDBC read); empty = all at once",
    )
    # iceberg (an existing table read as a source)
    table_identifier: str | None = None
    # recovery: an alternative source to fail over to until lineage routing takes over
    alternative_source_id: str | None = None
    options: dict[str, str] = Field(default_factory=dict)

    _v_id = field_validator("source_id")(lambda cls, v: check_id(v, "source_id"))

    @model_validator(mode="after")
    def _kind_fields(self) -> Source:
        if self.kind in ("files", "s3") and not self.format:
            raise ValueError(f"a {self.kind} source needs a format (parquet, csv or jsonl)")
        if self.kind == "files" and not self.path:
            raise ValueError("a files source needs a path")
        if self.kind == "s3" and not self.bucket:
            raise ValueError("an s3 source needs a bucket")
        if (self.dated_layout or self.path_columns) and self.kind not in ("files", "s3"):
            raise ValueError(f"dated_layout and path_columns apply to files and s3 sources, not {self.kind}")
        if self.dated_layout:
            if problem := dated_layout_problem(self.dated_layout):
                raise ValueError(f"dated_layout {self.dated_layout!r}: {problem}")
        names = [c.name.lower() for c in self.path_columns]
        if len(set(names)) != len(names):
            raise ValueError(f"path_columns: a column named twice in {names}")
        clash = set(names) & ({c.name.lower() for c in self.columns} | {p.column.lower() for p in self.promote_fields}
                              | {"_source_file", "_ingested_at"})
        if clash:
            raise ValueError(f"path_columns {sorted(clash)}: already a declared, promoted or lineage column")
        if self.kind == "jdbc":
            if not (self.jdbc_url or self.jdbc_url_env):
                raise ValueError("a jdbc source needs jdbc_url or jdbc_url_env")
            if bool(self.table) == bool(self.query):
                raise ValueError("a jdbc source needs exactly one of table or query")
            if self.jdbc_url and re.search(r"password=", self.jdbc_url, re.I):
                raise ValueError("jdbc_url must not carry a password: use password_env")
            if self.load_type == "incremental" and not (self.watermark_column and self.primary_key):
                raise ValueError("an incremental jdbc source needs watermark_column and primary_key")
            if self.partitioned and not self.partition_column:
                raise ValueError("a partitioned jdbc source needs partition_column")
        if self.max_parallel_queries is not None and not (self.kind == "jdbc" and self.partitioned):
            raise ValueError("max_parallel_queries caps a partitioned jdbc read: the source needs kind: jdbc "
                             "and partitioned: true")
        if self.max_parallel_queries is not None and \
                self.options.get("staging", "true").lower() in ("false", "0", "no"):
            raise ValueError("max_parallel_queries reads the partitions in waves staged one after another: "
                             "it needs the staged copy (drop options.staging: false)")
        if self.kind == "iceberg" and not self.table_identifier:
            raise ValueError("an iceberg source needs table_identifier")
        return self


class PartitionField(BaseModel):
    model_config = ConfigDict(extra="forbid")
    column: str
    transform: Literal["identity", "bucket", "truncate", "year", "month", "day", "hour"] = "identity"
    param: int | None = Field(default=None, description="N for bucket(N) / truncate(N)")

    @model_validator(mode="after")
    def _param(self) -> PartitionField:
        check_ident(self.column, "partition column")
        if self.transform in ("bucket", "truncate") and not self.param:
            raise ValueError(f"{self.transform} needs param (N)")
        return self


class SortField(BaseModel):
    model_config = ConfigDict(extra="forbid")
    column: str
    direction: Literal["asc", "desc"] = "asc"
    nulls: Literal["first", "last"] | None = None

    _v_col = field_validator("column")(lambda cls, v: check_ident(v, "sort column"))


class Maintenance(BaseModel):
    """Table maintenance of one target (lakehouse.table.maintenance); an unset field takes the platform
    default (platform setting `maintenance.<field>`), then the built-in one."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = Field(default=None, description="maintain this table at all (default true)")
    snapshot_max_age_hours: float | None = Field(
        default=None, gt=0, description="expire snapshots older than this (default 168); never the head of a "
        "branch or tag (kept audit branches), the newest min_snapshots_to_keep, or what an incremental "
        "consumer has not read yet")
    min_snapshots_to_keep: int | None = Field(default=None, ge=1, description="newest snapshots kept whatever "
                                              "their age (default 5)")
    target_file_size_mb: int | None = Field(default=None, ge=1, description="compaction's output file size "
                                            "(default 128)")
    small_file_mb: float | None = Field(default=None, gt=0, description="a data file under this size counts as "
                                        "small (default 32)")
    compact_min_small_files: int | None = Field(default=None, ge=2, description="compact once more than this "
                                                "many small files are live (default 10)")
    orphan_min_age_hours: float | None = Field(
        default=None, ge=24, description="remove files no snapshot references only when older than this "
        "(default 72; at least 24, which Iceberg's procedure insists on: a younger file may be a concurrent "
        "writer's, not yet committed)")
    rewrite_manifests: bool | None = Field(default=None, description="rewrite the manifests once the current "
                                           "snapshot has more than maintenance.MANIFEST_TRIGGER (default true)")


def check_maintenance_setting(key: str, value: str) -> None:
    """`maintenance.<field>` and `maintenance.schedule[.<namespace>]` platform settings, checked on load."""
    name = key[len("maintenance."):]
    if name == "schedule" or name.startswith("schedule."):
        if name.startswith("schedule."):
            check_ident(name[len("schedule."):], f"namespace in {key}")
        if len(value.split()) not in (5, 6):
            raise ValueError(f"{key}: {value!r} is not a cron expression (5 or 6 fields)")
        return
    if name not in Maintenance.model_fields:
        raise ValueError(f"{key}: unknown maintenance setting; known: schedule, schedule.<namespace>, "
                         + ", ".join(Maintenance.model_fields))
    try:
        Maintenance.model_validate({name: value})
    except ValueError as exc:
        msgs = "; ".join(e["msg"] for e in exc.errors()) if hasattr(exc, "errors") else str(exc)
        raise ValueError(f"{key}: {msgs}") from None


#: platform settings of the write engine (lakehouse.engines.choice): the default choice and auto's size threshold
ENGINE_SETTINGS = ("engine.default", "engine.arrow_max_bytes")
ENGINES = ("spark", "arrow", "auto")


def check_engine_setting(key: str, value: str) -> None:
    """`engine.default` (spark | arrow | auto) and `engine.arrow_max_bytes` (bytes), checked on load."""
    if key not in ENGINE_SETTINGS:
        raise ValueError(f"{key}: unknown engine setting; known: {', '.join(ENGINE_SETTINGS)}")
    if key == "engine.default":
        if value.strip() not in ENGINES:
            raise ValueError(f"{key}: {value!r} is not one of {', '.join(ENGINES)}")
    elif not value.strip().isdigit():
        raise ValueError(f"{key}: {value!r} is not a whole number of bytes")


class TimePartition(BaseModel):
    """A target partitioned by day, hour or month (lakehouse.stage.incremental, window_batches): a
    time-partitioned Dagster asset, and a run for a range of periods (a backfill from the UI or
    `lakehouse backfill`) recomputes exactly those periods from their upstream rows and replaces
    them, with write-audit-publish. Periods and their keys: lakehouse.metadata.periods."""

    model_config = ConfigDict(extra="forbid")
    column: str = Field(description="the column the target is identity-partitioned by (the stage outputs it): "
                        "a DATE for day and month (a month: its first day), a TIMESTAMP for hour (the hour's start, UTC)")
    start_date: date = Field(description="the first day there is data for (the first partition: that day, its first "
                             "hour, or the month starting on it)")
    granularity: Literal["day", "hour", "month"] = Field(
        default="day", description="one partition per day (Dagster DailyPartitionsDefinition), hour (Hourly, keys "
        "2026-11-02-05:00) or month (Monthly, keys 2026-11-01)")
    upstream: str | None = Field(
        default=None, description="a Spark SQL expression over an upstream row giving its period, e.g. "
        "CAST(event_ts AS DATE), date_trunc('HOUR', event_ts), CAST(date_trunc('MONTH', event_ts) AS DATE) "
        "(default: the upstream column named like column)")

    _v_col = field_validator("column")(lambda cls, v: check_ident(v, "column"))

    @model_validator(mode="after")
    def _month_starts_on_first(self) -> TimePartition:
        if self.granularity == "month" and self.start_date.day != 1:
            raise ValueError(f"monthly partitions start on the first day of a month, not {self.start_date}. "
                             f"Fix: start_date: \"{self.start_date.replace(day=1)}\"")
        return self


class Target(Entity):
    __key__ = ("target_id",)

    target_id: str
    kind: Literal["iceberg", "warehouse"] = "iceberg"
    description: str = ""
    namespace: str | None = None
    table: str | None = None
    partition_spec: list[PartitionField] = Field(default_factory=list)
    sort_order: list[SortField] = Field(default_factory=list)
    write_mode: Literal["append", "overwrite", "overwrite_partitions", "merge"] = "append"
    merge_keys: list[str] = Field(default_factory=list)
    table_properties: dict[str, str] = Field(default_factory=dict)
    maintenance: Maintenance | None = Field(default=None, description="table maintenance; unset fields take "
                                            "the platform defaults (settings maintenance.*)")
    export_target_id: str | None = Field(default=None, description="a warehouse target this table is exported to")
    time_partition: TimePartition | None = Field(
        default=None, description="time partitions (day, hour or month): a time-partitioned asset whose periods "
        "can be backfilled (UI, `lakehouse backfill`); a SQL stage over one upstream table writes it")
    alternative_source_id: str | None = Field(
        default=None, description="a declared replica of this table (a source, e.g. kind iceberg): SQL stages "
        "reading this table read the replica instead while the table is unavailable")
    engine: Literal["spark", "arrow", "auto"] | None = Field(
        default=None, description="what writes the table: spark, arrow (PyIceberg + Arrow, no JVM: file loads "
        "lakehouse.engines.arrow can do) or auto (arrow below arrow_max_bytes of input); default: the "
        "platform setting engine.default, else spark")
    arrow_max_bytes: int | None = Field(
        default=None, ge=0, description="auto: the largest planned input (bytes) written by Arrow; default: the "
        "platform setting engine.arrow_max_bytes")
    # warehouse
    jdbc_url: str | None = None
    jdbc_url_env: str | None = None
    user_env: str | None = None
    password_env: str | None = None
    warehouse_schema: str | None = None
    warehouse_table: str | None = None

    _v_id = field_validator("target_id")(lambda cls, v: check_id(v, "target_id"))
    _v_keys = field_validator("merge_keys")(lambda cls, v: check_columns(v, "merge_keys"))

    @model_validator(mode="after")
    def _kind_fields(self) -> Target:
        if self.kind == "iceberg":
            if not (self.namespace and self.table):
                raise ValueError("an iceberg target needs namespace and table")
            check_ident(self.namespace, "namespace")
            check_ident(self.table, "table")
            if self.write_mode == "merge" and not self.merge_keys:
                raise ValueError("write_mode merge needs merge_keys")
        else:
            if not (self.jdbc_url or self.jdbc_url_env):
                raise ValueError("a warehouse target needs jdbc_url or jdbc_url_env")
            if not self.warehouse_table:
                raise ValueError("a warehouse target needs warehouse_table")
        return self

    @property
    def identifier(self) -> str:
        """namespace.table, as PyIceberg and Spark (within the lake catalog) name it."""
        return f"{self.namespace}.{self.table}"


# --------------------------------------------------------------------------- validation


RuleType = Literal[
    "row_count",
    "row_count_change",
    "freshness",
    "schema_contract",
    "unique",
    "referential_integrity",
    "not_null",
    "accepted_values",
    "range",
    "regex",
    "expression",
]
ROW_RULES = {"not_null", "accepted_values", "range", "regex", "expression"}
_RULE_REQUIRES: dict[str, tuple[str, ...]] = {
    "row_count": (),
    "row_count_change": ("max_change_pct",),
    "freshness": ("column", "max_age_seconds"),
    "schema_contract": ("expected_columns",),
    "unique": ("columns",),
    "referential_integrity": ("columns", "ref_dataset", "ref_columns"),
    "not_null": ("columns",),
    "accepted_values": ("column", "values"),
    "range": ("column",),
    "regex": ("column", "pattern"),
    "expression": ("expression",),
}


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    type: RuleType
    enabled: bool = True
    severity: Literal["warn", "error"] = "error"
    action: Literal["warn", "drop", "quarantine", "fail"] = "fail"
    description: str = ""
    column: str | None = None
    columns: list[str] = Field(default_factory=list)
    min: float | str | None = None
    max: float | str | None = None
    values: list[Any] = Field(default_factory=list)
    pattern: str | None = None
    expression: str | None = Field(default=None, description="Spark SQL boolean; true = row passes")
    max_change_pct: float | None = None
    max_age_seconds: int | None = None
    expected_columns: list[ColumnSpec] = Field(default_factory=list)
    schema_policy: Literal["evolve", "freeze", "fail"] = "fail"
    ref_dataset: str | None = None
    ref_columns: list[str] = Field(default_factory=list)

    _v_name = field_validator("name")(lambda cls, v: check_ident(v, "rule name"))
    _v_column = field_validator("column")(lambda cls, v: v if v is None else check_column(v, "column"))
    _v_columns = field_validator("columns")(lambda cls, v: check_columns(v, "columns"))
    _v_ref_columns = field_validator("ref_columns")(lambda cls, v: check_columns(v, "ref_columns"))

    @model_validator(mode="after")
    def _required(self) -> Rule:
        missing = [f for f in _RULE_REQUIRES[self.type] if not getattr(self, f)]
        if missing:
            raise ValueError(f"rule {self.name!r} of type {self.type} needs {', '.join(missing)}")
        if self.type == "range" and self.min is None and self.max is None:
            raise ValueError(f"range rule {self.name!r} needs min or max")
        if self.type not in ROW_RULES and self.action in ("drop", "quarantine"):
            raise ValueError(f"rule {self.name!r}: action {self.action} applies to row rules only")
        if self.pattern:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"rule {self.name!r}: bad regex {self.pattern!r}: {exc}") from exc
        return self

    @property
    def is_row_rule(self) -> bool:
        return self.type in ROW_RULES

    @property
    def blocking(self) -> bool:
        return self.severity == "error"


class ValidationRuleSet(Entity):
    __key__ = ("rule_set_id",)

    rule_set_id: str
    description: str = ""
    rules: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> ValidationRuleSet:
        seen: set[str] = set()
        for r in self.rules:
            if r.name in seen:
                raise ValueError(f"duplicate rule name {r.name!r} in rule set {self.rule_set_id!r}")
            seen.add(r.name)
        return self


# --------------------------------------------------------------------------- control plane


class ControlFlag(Entity):
    __key__ = ("entity_type", "entity_id", "flag_name")

    entity_type: Literal["pipeline", "stage", "source", "target", "platform"]
    entity_id: str = Field(description="pipeline_id, pipeline_id.stage_name for a stage, a source_id, a target_id, "
                           "or * for the platform")
    flag_name: str = "enabled"
    flag_value: bool = True
    updated_at: datetime | None = None
    updated_by: str | None = None


class RetryPolicy(Entity):
    __key__ = ("retry_id",)

    retry_id: str
    max_retries: int = Field(default=3, ge=0, le=100)
    delay_seconds: float = Field(default=5.0, ge=0)
    backoff: Literal["constant", "linear", "exponential"] = "exponential"
    jitter: Literal["none", "full", "plus_minus"] = "plus_minus"


class HealingAction(Entity):
    __key__ = ("healing_id",)

    healing_id: str
    description: str = ""
    error_class: str | None = Field(default=None, description="exception class name (or a base class name)")
    message_regex: str | None = None
    error_code: str | None = Field(default=None, description="a code the platform assigns, see lakehouse.errors")
    actions: list[
        Literal[
            "retry_after_backoff",
            "refresh_and_recommit",
            "evolve_schema",
            "quarantine_input",
            "shrink_batch",
            "restart_spark_session",
            "switch_to_recovery_path",
            "run_command",
        ]
    ] = Field(min_length=1)
    max_attempts: int = Field(default=3, ge=1, le=20)
    backoff_seconds: float = Field(default=1.0, ge=0)
    command: str | None = None
    command_timeout_seconds: int = Field(default=300, ge=1)
    priority: int = 100

    @model_validator(mode="after")
    def _matcher(self) -> HealingAction:
        if not (self.error_class or self.message_regex or self.error_code):
            raise ValueError(f"healing action {self.healing_id!r} needs error_class, message_regex or error_code")
        if "run_command" in self.actions and not self.command:
            raise ValueError(f"healing action {self.healing_id!r} uses run_command but has no command")
        if self.message_regex:
            re.compile(self.message_regex)
        return self


class Profile(Entity):
    __key__ = ("profile_id",)

    profile_id: Literal["balanced", "focus"] | str
    description: str = ""


class PipelineProfile(Entity):
    __key__ = ("pipeline_id",)

    pipeline_id: str = Field(description="a pipeline id, or '*' for the global profile")
    profile_id: str


class ProfileSetting(Entity):
    __key__ = ("profile_id", "setting_key")

    profile_id: str
    setting_key: str
    setting_value: float


class Throttle(Entity):
    __key__ = ("throttle_id",)

    throttle_id: str
    entity_type: Literal["source", "target"]
    entity_id: str
    metric: Literal["max_concurrent", "records_per_minute", "bytes_per_hour"]
    threshold: float = Field(gt=0)

    @property
    def pool(self) -> str:
        return f"{self.entity_type}:{self.entity_id}"


class DatasetLineage(Entity):
    __key__ = ("from_dataset_id", "to_dataset_id")

    from_dataset_id: str
    to_dataset_id: str
    transform_name: str = ""
    cost: float = Field(default=1.0, ge=0)
    is_default: bool = True
    transformation_sql: str | None = None
    column_lineage: dict[str, list[str]] = Field(default_factory=dict)


class DatasetRecoveryPath(Entity):
    __key__ = ("dataset_id", "path_order")

    dataset_id: str
    path_order: int = Field(ge=1)
    path_sequence: list[str]
    cost: float = 0.0
    derived: bool = Field(
        default=False, description="written by `metadata apply` / `lineage sync` from the lineage graph and "
        "recomputed each time; rows without it are an operator's and are kept as written")


class Application(Entity):
    """A registered application: entity_raw.<application_id> exists for each one."""

    __key__ = ("application_id",)

    application_id: str
    description: str = ""
    enabled: bool = True
    source_id: str | None = Field(default=None, description="where the application's extraction output lands")
    entity_name_fields: dict[str, str] = Field(
        default_factory=lambda: {
            "database": "database_name",
            "schema": "schema_name",
            "table": "table_name",
            "view": "view_name",
            "column": "column_name",
        },
        description="typename -> raw field holding the entity's name",
    )
    partition_by_day: bool = Field(
        default=False, description="partition entity_raw.<app> by the UTC day of extracted_at (Iceberg "
        "truncate[86400000] on the epoch-ms column) besides typename")
    validation_set_id: str | None = Field(
        default=None, description="rules every load into entity_raw.<app> is audited with before it is published")
    max_record_bytes: int = Field(
        default=1_048_576, ge=1, description="largest raw_record (UTF-8 bytes of its JSON) loaded; a bigger "
        "record is quarantined whole with its key in entity_raw.<app>__quarantine, never loaded truncated")
    engine: Literal["spark", "arrow", "auto"] | None = Field(
        default=None, description="what writes entity_raw.<app>: spark, arrow (PyIceberg + Arrow, no JVM) or auto "
        "(arrow up to arrow_max_bytes of input files); default: the platform setting engine.default, else spark")
    arrow_max_bytes: int | None = Field(
        default=None, ge=0, description="auto: the largest load (bytes of input files) written by Arrow; default: "
        "the platform setting engine.arrow_max_bytes")

    _v_id = field_validator("application_id")(lambda cls, v: check_ident(v.lower(), "application_id"))


class AuditLogEntry(BaseModel):
    """Written by the platform, never by YAML; the control DB assigns the id."""

    model_config = ConfigDict(extra="forbid")

    id: int | None = None
    ts: datetime | None = None
    run_id: str | None = None
    pipeline_id: str | None = None
    stage_name: str | None = None
    dataset: str | None = None
    event: str
    error_class: str | None = None
    message: str | None = None
    action: str | None = None
    outcome: str | None = None
    duration_ms: int | None = None
    details: dict[str, Any] = Field(default_factory=dict)


AlertEvent = Literal["audit_failed", "run_failed", "run_canceled", "kill_switch", "source_unavailable"]


class AlertChannel(Entity):
    """Where alerts go (Slack or a webhook) and for which pipelines, criticalities and events.

    Secrets never sit in metadata: the Slack bot token, a webhook's bearer token and a webhook URL
    that carries a secret are read from the environment variables named here."""

    __key__ = ("channel_id",)

    channel_id: str
    kind: Literal["slack", "webhook"]
    enabled: bool = True
    description: str = ""
    pipelines: list[str] = Field(default_factory=list, description="alerts of these pipelines (empty with no "
                                 "criticalities: every pipeline)")
    criticalities: list[Literal["critical", "high", "normal", "low"]] = Field(
        default_factory=list, description="alerts of pipelines with these criticalities (OR with `pipelines`)")
    events: list[AlertEvent] = Field(default_factory=list, description="alert kinds sent here (empty: all)")
    slack_channel: str | None = Field(default=None, description="Slack channel name or id, e.g. #data-alerts")
    token_env: str | None = Field(default=None, description="env var with the Slack bot token (default "
                                  "SLACK_BOT_TOKEN) or the webhook's bearer token")
    api_url: str | None = Field(default=None, description="Slack Web API base URL (default https://slack.com/api/)")
    url: str | None = Field(default=None, description="webhook URL (no credentials in it: use url_env)")
    url_env: str | None = Field(default=None, description="env var holding the webhook URL")
    headers: dict[str, str] = Field(default_factory=dict, description="extra (non-secret) webhook headers")
    timeout_seconds: float = Field(default=5.0, gt=0, le=60)

    _v_id = field_validator("channel_id")(lambda cls, v: check_id(v, "channel_id"))

    @model_validator(mode="after")
    def _kind_fields(self) -> AlertChannel:
        if self.kind == "slack" and not self.slack_channel:
            raise ValueError(f"slack alert channel {self.channel_id!r} needs slack_channel")
        if self.kind == "webhook" and not (self.url or self.url_env):
            raise ValueError(f"webhook alert channel {self.channel_id!r} needs url or url_env")
        for name in ("url", "api_url"):
            value = getattr(self, name)
            if value and re.match(r"^[a-z][a-z0-9+.-]*://[^/@]*@", value, re.I):
                raise ValueError(f"alert channel {self.channel_id!r}: {name} must not carry credentials; "
                                 "put the URL in an env var named by url_env")
        return self

    def wants(self, event: str, pipeline_id: str | None, criticality: str | None) -> bool:
        if not self.enabled or (self.events and event not in self.events):
            return False
        if not self.pipelines and not self.criticalities:
            return True
        return (pipeline_id in self.pipelines) or (criticality is not None and criticality in self.criticalities)


class PlatformSetting(Entity):
    __key__ = ("setting_key",)

    setting_key: str
    setting_value: str

    @model_validator(mode="after")
    def _known_values(self) -> PlatformSetting:
        if self.setting_key.startswith("maintenance."):
            check_maintenance_setting(self.setting_key, self.setting_value)
        if self.setting_key.startswith("engine."):
            check_engine_setting(self.setting_key, self.setting_value)
        if self.setting_key == "run.warn_error" and self.setting_value.strip().lower() not in (
                "true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"run.warn_error must be true or false, not {self.setting_value!r}")
        return self


# --------------------------------------------------------------------------- the catalog

#: section name in YAML / control-DB table name -> model; order matters for FK checks.
SECTIONS: dict[str, type[Entity]] = {
    "pipelines": Pipeline,
    "sources": Source,
    "targets": Target,
    "validation_rules": ValidationRuleSet,
    "retry_policies": RetryPolicy,
    "stages": Stage,
    "control_flags": ControlFlag,
    "healing_actions": HealingAction,
    "profiles": Profile,
    "pipeline_profiles": PipelineProfile,
    "profile_settings": ProfileSetting,
    "throttles": Throttle,
    "dataset_lineage": DatasetLineage,
    "dataset_recovery_paths": DatasetRecoveryPath,
    "applications": Application,
    "platform_settings": PlatformSetting,
    "alert_channels": AlertChannel,
}


class MetadataCatalog(BaseModel):
    """Every metadata row, validated together: cross references, stage cycles, duplicate keys."""

    model_config = ConfigDict(extra="forbid")

    pipelines: list[Pipeline] = Field(default_factory=list)
    sources: list[Source] = Field(default_factory=list)
    targets: list[Target] = Field(default_factory=list)
    validation_rules: list[ValidationRuleSet] = Field(default_factory=list)
    retry_policies: list[RetryPolicy] = Field(default_factory=list)
    stages: list[Stage] = Field(default_factory=list)
    control_flags: list[ControlFlag] = Field(default_factory=list)
    healing_actions: list[HealingAction] = Field(default_factory=list)
    profiles: list[Profile] = Field(default_factory=list)
    pipeline_profiles: list[PipelineProfile] = Field(default_factory=list)
    profile_settings: list[ProfileSetting] = Field(default_factory=list)
    throttles: list[Throttle] = Field(default_factory=list)
    dataset_lineage: list[DatasetLineage] = Field(default_factory=list)
    dataset_recovery_paths: list[DatasetRecoveryPath] = Field(default_factory=list)
    applications: list[Application] = Field(default_factory=list)
    platform_settings: list[PlatformSetting] = Field(default_factory=list)
    alert_channels: list[AlertChannel] = Field(default_factory=list)

    # {name: (the list it indexes, its length, {key: row})}: lookups in O(1) at thousands of rows;
    # rebuilt when a section's list is replaced or changes length (rows are never edited in place)
    _indexes: dict[str, tuple[list, int, dict]] = PrivateAttr(default_factory=dict)

    def _index(self, name: str, section: str, key, many: bool = False) -> dict:
        rows = getattr(self, section)
        hit = self._indexes.get(name)
        if hit is None or hit[0] is not rows or hit[1] != len(rows):
            index: dict = {}
            for r in rows:
                k = key(r)
                if k is None:
                    continue
                if many:
                    index.setdefault(k, []).append(r)
                else:
                    index.setdefault(k, r)  # the first row wins, as a scan would find it
            hit = (rows, len(rows), index)
            self._indexes[name] = hit
        return hit[2]

    # ---- lookups
    def pipeline(self, pipeline_id: str) -> Pipeline:
        return _find(self.pipelines, "pipeline", pipeline_id, self._index("pipeline", "pipelines", _key1))

    def source(self, source_id: str) -> Source:
        return _find(self.sources, "source", source_id, self._index("source", "sources", _key1))

    def target(self, target_id: str) -> Target:
        return _find(self.targets, "target", target_id, self._index("target", "targets", _key1))

    def rule_set(self, rule_set_id: str) -> ValidationRuleSet:
        return _find(self.validation_rules, "validation rule set", rule_set_id,
                     self._index("rule_set", "validation_rules", _key1))

    def retry_policy(self, retry_id: str) -> RetryPolicy:
        return _find(self.retry_policies, "retry policy", retry_id)

    def stages_of(self, pipeline_id: str) -> list[Stage]:
        stages = self._index("stages_of", "stages", lambda s: s.pipeline_id, many=True).get(pipeline_id, [])
        return sorted(stages, key=lambda s: s.stage_order)

    def stage(self, pipeline_id: str, stage_name: str) -> Stage:
        s = self._index("stage", "stages", lambda s: (s.pipeline_id, s.stage_name)).get((pipeline_id, stage_name))
        if s is not None:
            return s
        names = [s.stage_name for s in self.stages_of(pipeline_id)]
        raise KeyError(f"unknown stage {stage_name!r} of pipeline {pipeline_id!r}; known: {names}")

    def stage_for_target(self, target_id: str) -> Stage | None:
        return self._index("stage_for_target", "stages", lambda s: s.target_id).get(target_id)

    def target_by_identifier(self, identifier: str) -> Target | None:
        return self._index("target_by_identifier", "targets",
                           lambda t: t.identifier.lower() if t.kind == "iceberg" else None).get(identifier.lower())

    def application(self, application_id: str) -> Application:
        return _find(self.applications, "application", application_id.lower())

    def setting(self, key: str, default: str | None = None) -> str | None:
        for s in self.platform_settings:
            if s.setting_key == key:
                return s.setting_value
        return default


def _key1(row: Entity):
    return row.key()[0]


def _find(rows: list, what: str, key: str, index: dict | None = None):
    if index is not None:
        if key in index:
            return index[key]
    else:
        for r in rows:
            if r.key() == (key,):
                return r
    known = sorted(str(r.key()[0]) for r in rows)
    raise KeyError(f"unknown {what} {key!r}; known: {known}")
