"""Every table of the control database, in one SQLAlchemy `MetaData`.

One place, so that what a control DB holds never depends on which modules a process happened to
import, and so that Alembic (lakehouse/metadata/migrations) can compare the migrations with it.
Importing this module creates nothing: tables are created and upgraded by
`lakehouse.metadata.migrate.upgrade` (`lakehouse metadata apply`, platform start-up, first use).

The metadata sections (pipelines, stages, sources...) are derived from the pydantic model, one
column per scalar field (so operators can `UPDATE control_flags SET flag_value = false ...` with
plain SQL) and JSON text for nested fields; a new model field needs a migration revision
(`lakehouse metadata revision -m "..."`), which tests/test_control_schema.py enforces.
"""

from __future__ import annotations

import types
import typing
from datetime import datetime
from typing import Any, Literal, get_args, get_origin

import sqlalchemy as sa
from pydantic import BaseModel

from lakehouse.metadata.model import SECTIONS

metadata_obj = sa.MetaData()


def _unwrap(annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
        return args
    return annotation


def _sa_type(annotation: Any) -> tuple[sa.types.TypeEngine, bool]:
    """(column type, is_json) for a pydantic field annotation."""
    a = _unwrap(annotation)
    if isinstance(a, list):  # a union of several types: store as JSON
        return sa.Text(), True
    if get_origin(a) is Literal:
        return sa.String(64), False
    if a is bool:
        return sa.Boolean(), False
    if a is int:
        return sa.BigInteger(), False
    if a is float:
        return sa.Float(), False
    if a is str:
        return sa.Text(), False
    if a is datetime:
        return sa.DateTime(timezone=True), False
    return sa.Text(), True


def _table_for(name: str, model: type[BaseModel], key: tuple[str, ...]) -> tuple[sa.Table, set[str]]:
    cols = []
    json_cols: set[str] = set()
    for fname, finfo in model.model_fields.items():
        typ, is_json = _sa_type(finfo.annotation)
        if fname in key and isinstance(typ, sa.Text):
            typ = sa.String(255)  # indexable primary key
        if is_json:
            json_cols.add(fname)
        cols.append(sa.Column(fname, typ, primary_key=fname in key, nullable=fname not in key))
    return sa.Table(name, metadata_obj, *cols), json_cols


TABLES: dict[str, tuple[sa.Table, set[str]]] = {
    section: _table_for(section, model, model.__key__) for section, model in SECTIONS.items()
}

audit_log = sa.Table(
    "audit_log",
    metadata_obj,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
    sa.Column("run_id", sa.String(64)),
    sa.Column("pipeline_id", sa.String(128)),
    sa.Column("stage_name", sa.String(128)),
    sa.Column("dataset", sa.String(255)),
    sa.Column("event", sa.String(64), nullable=False),
    sa.Column("error_class", sa.String(255)),
    sa.Column("message", sa.Text),
    sa.Column("action", sa.String(64)),
    sa.Column("outcome", sa.String(64)),
    sa.Column("duration_ms", sa.BigInteger),
    sa.Column("details", sa.Text),
    sa.Index("ix_audit_pipeline_ts", "pipeline_id", "ts"),
    sa.Index("ix_audit_run", "run_id"),  # a run's own rows: run summaries, `lakehouse audit --run`, tests
)

# What `apply` derives per stage from its SQL and rules (lakehouse.metadata.derived): read when the
# definitions are built, so that loading them parses no SQL. JSON columns hold plain data.
derived_stages = sa.Table(
    "derived_stages",
    metadata_obj,
    sa.Column("pipeline_id", sa.String(255), primary_key=True),
    sa.Column("stage_name", sa.String(255), primary_key=True),
    sa.Column("target_id", sa.String(255), nullable=False),
    sa.Column("inputs_hash", sa.String(64), nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("upstream_tables", sa.Text),
    sa.Column("column_lineage", sa.Text),
    sa.Column("lineage_note", sa.Text),
    sa.Column("output_columns", sa.Text),
    sa.Column("check_specs", sa.Text),
    sa.Column("derived_at", sa.DateTime(timezone=True), nullable=False),
)


# --- validation history (lakehouse.validation.history)
check_results = sa.Table(
    "check_results",
    metadata_obj,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
    sa.Column("run_id", sa.String(64)),
    sa.Column("pipeline_id", sa.String(128)),
    sa.Column("stage_name", sa.String(128)),
    sa.Column("dataset", sa.String(255), nullable=False),
    sa.Column("rule", sa.String(128), nullable=False),
    sa.Column("rule_type", sa.String(64)),
    sa.Column("severity", sa.String(16)),
    sa.Column("action", sa.String(16)),
    sa.Column("passed", sa.Boolean, nullable=False),
    sa.Column("failed_rows", sa.BigInteger),
    sa.Column("total_rows", sa.BigInteger),
    sa.Column("message", sa.Text),
    sa.Column("details", sa.Text),
    sa.Index("ix_check_results_dataset_rule_ts", "dataset", "rule", "ts"),
)

# --- load jobs of the entity_raw service (lakehouse.service.jobs)
load_jobs = sa.Table(
    "load_jobs",
    metadata_obj,
    sa.Column("job_id", sa.String(64), primary_key=True),  # = the Dagster run id
    sa.Column("tenant_id", sa.String(255), nullable=False),
    sa.Column("application", sa.String(128), nullable=False),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    sa.Column("result", sa.Text),
    sa.Column("error", sa.Text),
    sa.Index("ix_load_jobs_tenant", "tenant_id", "submitted_at"),
)

# --- per-tenant bearer tokens of the load API (lakehouse.service.tokens): only a hash is kept
api_tokens = sa.Table(
    "api_tokens",
    metadata_obj,
    sa.Column("token_id", sa.String(32), primary_key=True),  # the public part of the token
    sa.Column("tenant_id", sa.String(255), nullable=False),
    sa.Column("applications", sa.Text, nullable=False),  # JSON list of application ids, or ["*"]
    sa.Column("token_hash", sa.String(128), nullable=False),  # sha256 of the secret part
    sa.Column("label", sa.String(255)),
    sa.Column("replaces", sa.String(32)),  # the token this one rotated (both valid until that one is revoked)
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True)),
    sa.Index("ix_api_tokens_tenant", "tenant_id"),
)

# --- alerts outbox (lakehouse.ops.alerts)
alerts_table = sa.Table(
    "alerts",
    metadata_obj,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dedupe_key", sa.String(512), nullable=False, unique=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("pipeline_id", sa.String(128)),
    sa.Column("stage", sa.String(256)),
    sa.Column("dataset", sa.String(255)),
    sa.Column("rule", sa.Text),
    sa.Column("failing_count", sa.BigInteger),
    sa.Column("run_id", sa.String(64)),
    sa.Column("message", sa.Text),
    sa.Column("next_step", sa.Text),
    sa.Column("details", sa.Text),
    sa.Index("ix_alerts_created", "created_at"),
)

alert_runs = sa.Table(
    "alert_runs",
    metadata_obj,
    sa.Column("alert_id", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Index("ix_alert_runs_run", "run_id"),
)

alert_deliveries = sa.Table(
    "alert_deliveries",
    metadata_obj,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("alert_id", sa.Integer, nullable=False),
    sa.Column("channel_id", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),  # pending | sending | sent | failed
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
    sa.Column("claimed_at", sa.DateTime(timezone=True)),
    sa.Column("claim", sa.String(32)),
    sa.Column("sent_at", sa.DateTime(timezone=True)),
    sa.Column("last_error", sa.Text),
    sa.UniqueConstraint("alert_id", "channel_id", name="uq_alert_delivery"),
    sa.Index("ix_alert_deliveries_due", "status", "next_attempt_at"),
)

# --- rate-limit token buckets (lakehouse.throughput.ratelimit)
buckets = sa.Table(
    "throttle_buckets",
    metadata_obj,
    sa.Column("bucket_key", sa.String(255), primary_key=True),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),  # epoch seconds of the last refill
    sa.Column("rate_per_s", sa.Float, nullable=False),
    sa.Column("capacity", sa.Float, nullable=False),
)

# --- file checkpoints and arrivals (lakehouse.ingest.checkpoints)
file_checkpoints = sa.Table(
    "file_checkpoints",
    metadata_obj,
    sa.Column("table_ident", sa.String(255), primary_key=True),
    sa.Column("file_key", sa.String(1024), primary_key=True),
    sa.Column("etag", sa.String(128), primary_key=True),
    sa.Column("size", sa.BigInteger),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("run_id", sa.String(64)),
    sa.Column("snapshot_id", sa.BigInteger),
    sa.Column("error", sa.Text),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_file_checkpoints_status", "table_ident", "status"),
)

checkpoint_marks = sa.Table(
    "checkpoint_marks",
    metadata_obj,
    sa.Column("table_ident", sa.String(255), primary_key=True),
    sa.Column("snapshot_id", sa.BigInteger),
    sa.Column("committed_at_ms", sa.BigInteger),
    sa.Column("synced_at", sa.DateTime(timezone=True)),
)

#: per (table, source): the listing high-water key (every key <= it is handled) and the last full listing
ingest_cursors = sa.Table(
    "ingest_cursors",
    metadata_obj,
    sa.Column("table_ident", sa.String(255), primary_key=True),
    sa.Column("source_id", sa.String(128), primary_key=True),
    sa.Column("after_key", sa.String(1024)),
    sa.Column("reconciled_at", sa.Float),
    sa.Column("updated_at", sa.DateTime(timezone=True)),
)

#: the files of each batch a sensor requested, keyed by the run key: the run reads exactly these
arrival_requests = sa.Table(
    "arrival_requests",
    metadata_obj,
    sa.Column("batch_key", sa.String(64), primary_key=True),
    sa.Column("file_key", sa.String(1024), primary_key=True),
    sa.Column("etag", sa.String(128), nullable=False),
    sa.Column("size", sa.BigInteger),
    sa.Column("source_id", sa.String(128)),
    sa.Column("table_ident", sa.String(255)),
    sa.Column("requested_at", sa.Float, nullable=False),
    sa.Index("ix_arrival_requests_src", "source_id", "requested_at"),
)

# --- audit branch hygiene (lakehouse.table.branches)
kept_branches = sa.Table(
    "kept_branches",
    metadata_obj,
    sa.Column("table_ident", sa.String(255), primary_key=True),
    sa.Column("branch", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(128)),
    sa.Column("kept_at", sa.Float, nullable=False),
    sa.Column("reason", sa.Text),
)

orphan_sweeps = sa.Table(
    "orphan_sweeps",
    metadata_obj,
    sa.Column("table_ident", sa.String(255), primary_key=True),
    sa.Column("lease_table", sa.String(255), nullable=False),
    sa.Column("due_at", sa.Float, nullable=False),
    sa.Column("reason", sa.Text),
)

# --- run leases and work claims (lakehouse.runtime.coordination)
run_leases = sa.Table(
    "run_leases",
    metadata_obj,
    sa.Column("run_key", sa.String(64), primary_key=True),
    sa.Column("table_ident", sa.String(255), primary_key=True),
    sa.Column("run_id", sa.String(128)),
    sa.Column("host", sa.String(255)),
    sa.Column("pid", sa.Integer),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
)

work_claims = sa.Table(
    "work_claims",
    metadata_obj,
    sa.Column("table_ident", sa.String(255), primary_key=True),
    sa.Column("work_key", sa.String(768), primary_key=True),
    sa.Column("version", sa.String(255), primary_key=True),
    sa.Column("run_key", sa.String(64), nullable=False),
    sa.Column("claimed_at", sa.Float, nullable=False),
    sa.Index("ix_work_claims_run", "run_key", "table_ident"),
)
