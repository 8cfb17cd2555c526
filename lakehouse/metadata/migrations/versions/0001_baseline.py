"""Baseline: the control DB as the code created it before migrations existed.

Frozen here (not read from lakehouse.metadata.schema, which moves on): what a later revision
changes, it changes on top of this. A control DB created by that older code (tables, no
`alembic_version`) or by an even older release (a table or a model field's column missing) is
brought to this revision by creating only what it lacks; a fresh one gets every table.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_baseline = sa.MetaData()

sa.Table(
    "alert_channels",
    _baseline,
    sa.Column("channel_id", sa.String(length=255), nullable=False),
    sa.Column("kind", sa.String(length=64), nullable=True),
    sa.Column("enabled", sa.Boolean(), nullable=True),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("pipelines", sa.Text(), nullable=True),
    sa.Column("criticalities", sa.Text(), nullable=True),
    sa.Column("events", sa.Text(), nullable=True),
    sa.Column("slack_channel", sa.Text(), nullable=True),
    sa.Column("token_env", sa.Text(), nullable=True),
    sa.Column("api_url", sa.Text(), nullable=True),
    sa.Column("url", sa.Text(), nullable=True),
    sa.Column("url_env", sa.Text(), nullable=True),
    sa.Column("headers", sa.Text(), nullable=True),
    sa.Column("timeout_seconds", sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint("channel_id"),
)
sa.Table(
    "alert_deliveries",
    _baseline,
    sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
    sa.Column("alert_id", sa.Integer(), nullable=False),
    sa.Column("channel_id", sa.String(length=255), nullable=False),
    sa.Column("status", sa.String(length=16), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("claim", sa.String(length=32), nullable=True),
    sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("alert_id", "channel_id", name="uq_alert_delivery"),
)
sa.Index(
    "ix_alert_deliveries_due",
    _baseline.tables["alert_deliveries"].c.status,
    _baseline.tables["alert_deliveries"].c.next_attempt_at,
)
sa.Table(
    "alert_runs",
    _baseline,
    sa.Column("alert_id", sa.Integer(), nullable=False),
    sa.Column("run_id", sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint("alert_id", "run_id"),
)
sa.Index("ix_alert_runs_run", _baseline.tables["alert_runs"].c.run_id)
sa.Table(
    "alerts",
    _baseline,
    sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
    sa.Column("dedupe_key", sa.String(length=512), nullable=False),
    sa.Column("kind", sa.String(length=32), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("pipeline_id", sa.String(length=128), nullable=True),
    sa.Column("stage", sa.String(length=256), nullable=True),
    sa.Column("dataset", sa.String(length=255), nullable=True),
    sa.Column("rule", sa.Text(), nullable=True),
    sa.Column("failing_count", sa.BigInteger(), nullable=True),
    sa.Column("run_id", sa.String(length=64), nullable=True),
    sa.Column("message", sa.Text(), nullable=True),
    sa.Column("next_step", sa.Text(), nullable=True),
    sa.Column("details", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("dedupe_key"),
)
sa.Index("ix_alerts_created", _baseline.tables["alerts"].c.created_at)
sa.Table(
    "applications",
    _baseline,
    sa.Column("application_id", sa.String(length=255), nullable=False),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("enabled", sa.Boolean(), nullable=True),
    sa.Column("source_id", sa.Text(), nullable=True),
    sa.Column("entity_name_fields", sa.Text(), nullable=True),
    sa.Column("partition_by_day", sa.Boolean(), nullable=True),
    sa.Column("max_record_bytes", sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint("application_id"),
)
sa.Table(
    "arrival_requests",
    _baseline,
    sa.Column("batch_key", sa.String(length=64), nullable=False),
    sa.Column("file_key", sa.String(length=1024), nullable=False),
    sa.Column("etag", sa.String(length=128), nullable=False),
    sa.Column("size", sa.BigInteger(), nullable=True),
    sa.Column("source_id", sa.String(length=128), nullable=True),
    sa.Column("table_ident", sa.String(length=255), nullable=True),
    sa.Column("requested_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("batch_key", "file_key"),
)
sa.Index(
    "ix_arrival_requests_src",
    _baseline.tables["arrival_requests"].c.source_id,
    _baseline.tables["arrival_requests"].c.requested_at,
)
sa.Table(
    "audit_log",
    _baseline,
    sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
    sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
    sa.Column("run_id", sa.String(length=64), nullable=True),
    sa.Column("pipeline_id", sa.String(length=128), nullable=True),
    sa.Column("stage_name", sa.String(length=128), nullable=True),
    sa.Column("dataset", sa.String(length=255), nullable=True),
    sa.Column("event", sa.String(length=64), nullable=False),
    sa.Column("error_class", sa.String(length=255), nullable=True),
    sa.Column("message", sa.Text(), nullable=True),
    sa.Column("action", sa.String(length=64), nullable=True),
    sa.Column("outcome", sa.String(length=64), nullable=True),
    sa.Column("duration_ms", sa.BigInteger(), nullable=True),
    sa.Column("details", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("id"),
)
sa.Index("ix_audit_pipeline_ts", _baseline.tables["audit_log"].c.pipeline_id, _baseline.tables["audit_log"].c.ts)
sa.Table(
    "check_results",
    _baseline,
    sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
    sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
    sa.Column("run_id", sa.String(length=64), nullable=True),
    sa.Column("pipeline_id", sa.String(length=128), nullable=True),
    sa.Column("stage_name", sa.String(length=128), nullable=True),
    sa.Column("dataset", sa.String(length=255), nullable=False),
    sa.Column("rule", sa.String(length=128), nullable=False),
    sa.Column("rule_type", sa.String(length=64), nullable=True),
    sa.Column("severity", sa.String(length=16), nullable=True),
    sa.Column("action", sa.String(length=16), nullable=True),
    sa.Column("passed", sa.Boolean(), nullable=False),
    sa.Column("failed_rows", sa.BigInteger(), nullable=True),
    sa.Column("total_rows", sa.BigInteger(), nullable=True),
    sa.Column("message", sa.Text(), nullable=True),
    sa.Column("details", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("id"),
)
sa.Index(
    "ix_check_results_dataset_rule_ts",
    _baseline.tables["check_results"].c.dataset,
    _baseline.tables["check_results"].c.rule,
    _baseline.tables["check_results"].c.ts,
)
sa.Table(
    "checkpoint_marks",
    _baseline,
    sa.Column("table_ident", sa.String(length=255), nullable=False),
    sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
    sa.Column("committed_at_ms", sa.BigInteger(), nullable=True),
    sa.Column("synced_at", sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("table_ident"),
)
sa.Table(
    "control_flags",
    _baseline,
    sa.Column("entity_type", sa.String(length=64), nullable=False),
    sa.Column("entity_id", sa.String(length=255), nullable=False),
    sa.Column("flag_name", sa.String(length=255), nullable=False),
    sa.Column("flag_value", sa.Boolean(), nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("updated_by", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("entity_type", "entity_id", "flag_name"),
)
sa.Table(
    "dataset_lineage",
    _baseline,
    sa.Column("from_dataset_id", sa.String(length=255), nullable=False),
    sa.Column("to_dataset_id", sa.String(length=255), nullable=False),
    sa.Column("transform_name", sa.Text(), nullable=True),
    sa.Column("cost", sa.Float(), nullable=True),
    sa.Column("is_default", sa.Boolean(), nullable=True),
    sa.Column("transformation_sql", sa.Text(), nullable=True),
    sa.Column("column_lineage", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("from_dataset_id", "to_dataset_id"),
)
sa.Table(
    "dataset_recovery_paths",
    _baseline,
    sa.Column("dataset_id", sa.String(length=255), nullable=False),
    sa.Column("path_order", sa.BigInteger(), nullable=False),
    sa.Column("path_sequence", sa.Text(), nullable=True),
    sa.Column("cost", sa.Float(), nullable=True),
    sa.Column("derived", sa.Boolean(), nullable=True),
    sa.PrimaryKeyConstraint("dataset_id", "path_order"),
)
sa.Table(
    "derived_stages",
    _baseline,
    sa.Column("pipeline_id", sa.String(length=255), nullable=False),
    sa.Column("stage_name", sa.String(length=255), nullable=False),
    sa.Column("target_id", sa.String(length=255), nullable=False),
    sa.Column("inputs_hash", sa.String(length=64), nullable=False),
    sa.Column("fingerprint", sa.String(length=64), nullable=False),
    sa.Column("upstream_tables", sa.Text(), nullable=True),
    sa.Column("column_lineage", sa.Text(), nullable=True),
    sa.Column("lineage_note", sa.Text(), nullable=True),
    sa.Column("output_columns", sa.Text(), nullable=True),
    sa.Column("check_specs", sa.Text(), nullable=True),
    sa.Column("derived_at", sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint("pipeline_id", "stage_name"),
)
sa.Table(
    "file_checkpoints",
    _baseline,
    sa.Column("table_ident", sa.String(length=255), nullable=False),
    sa.Column("file_key", sa.String(length=1024), nullable=False),
    sa.Column("etag", sa.String(length=128), nullable=False),
    sa.Column("size", sa.BigInteger(), nullable=True),
    sa.Column("status", sa.String(length=16), nullable=False),
    sa.Column("run_id", sa.String(length=64), nullable=True),
    sa.Column("snapshot_id", sa.BigInteger(), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint("table_ident", "file_key", "etag"),
)
sa.Index(
    "ix_file_checkpoints_status",
    _baseline.tables["file_checkpoints"].c.table_ident,
    _baseline.tables["file_checkpoints"].c.status,
)
sa.Table(
    "healing_actions",
    _baseline,
    sa.Column("healing_id", sa.String(length=255), nullable=False),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("error_class", sa.Text(), nullable=True),
    sa.Column("message_regex", sa.Text(), nullable=True),
    sa.Column("error_code", sa.Text(), nullable=True),
    sa.Column("actions", sa.Text(), nullable=True),
    sa.Column("max_attempts", sa.BigInteger(), nullable=True),
    sa.Column("backoff_seconds", sa.Float(), nullable=True),
    sa.Column("command", sa.Text(), nullable=True),
    sa.Column("command_timeout_seconds", sa.BigInteger(), nullable=True),
    sa.Column("priority", sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint("healing_id"),
)
sa.Table(
    "ingest_cursors",
    _baseline,
    sa.Column("table_ident", sa.String(length=255), nullable=False),
    sa.Column("source_id", sa.String(length=128), nullable=False),
    sa.Column("after_key", sa.String(length=1024), nullable=True),
    sa.Column("reconciled_at", sa.Float(), nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint("table_ident", "source_id"),
)
sa.Table(
    "kept_branches",
    _baseline,
    sa.Column("table_ident", sa.String(length=255), nullable=False),
    sa.Column("branch", sa.String(length=64), nullable=False),
    sa.Column("run_id", sa.String(length=128), nullable=True),
    sa.Column("kept_at", sa.Float(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("table_ident", "branch"),
)
sa.Table(
    "load_jobs",
    _baseline,
    sa.Column("job_id", sa.String(length=64), nullable=False),
    sa.Column("tenant_id", sa.String(length=255), nullable=False),
    sa.Column("application", sa.String(length=128), nullable=False),
    sa.Column("request", sa.Text(), nullable=False),
    sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("result", sa.Text(), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("job_id"),
)
sa.Index("ix_load_jobs_tenant", _baseline.tables["load_jobs"].c.tenant_id, _baseline.tables["load_jobs"].c.submitted_at)
sa.Table(
    "orphan_sweeps",
    _baseline,
    sa.Column("table_ident", sa.String(length=255), nullable=False),
    sa.Column("lease_table", sa.String(length=255), nullable=False),
    sa.Column("due_at", sa.Float(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("table_ident"),
)
sa.Table(
    "pipeline_profiles",
    _baseline,
    sa.Column("pipeline_id", sa.String(length=255), nullable=False),
    sa.Column("profile_id", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("pipeline_id"),
)
sa.Table(
    "pipelines",
    _baseline,
    sa.Column("pipeline_id", sa.String(length=255), nullable=False),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("owner", sa.Text(), nullable=True),
    sa.Column("enabled", sa.Boolean(), nullable=True),
    sa.Column("criticality", sa.String(length=64), nullable=True),
    sa.Column("default_retry_id", sa.Text(), nullable=True),
    sa.Column("schedule", sa.Text(), nullable=True),
    sa.Column("timezone", sa.Text(), nullable=True),
    sa.Column("tags", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("pipeline_id"),
)
sa.Table(
    "platform_settings",
    _baseline,
    sa.Column("setting_key", sa.String(length=255), nullable=False),
    sa.Column("setting_value", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("setting_key"),
)
sa.Table(
    "profile_settings",
    _baseline,
    sa.Column("profile_id", sa.String(length=255), nullable=False),
    sa.Column("setting_key", sa.String(length=255), nullable=False),
    sa.Column("setting_value", sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint("profile_id", "setting_key"),
)
sa.Table(
    "profiles",
    _baseline,
    sa.Column("profile_id", sa.String(length=255), nullable=False),
    sa.Column("description", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("profile_id"),
)
sa.Table(
    "retry_policies",
    _baseline,
    sa.Column("retry_id", sa.String(length=255), nullable=False),
    sa.Column("max_retries", sa.BigInteger(), nullable=True),
    sa.Column("delay_seconds", sa.Float(), nullable=True),
    sa.Column("backoff", sa.String(length=64), nullable=True),
    sa.Column("jitter", sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint("retry_id"),
)
sa.Table(
    "run_leases",
    _baseline,
    sa.Column("run_key", sa.String(length=64), nullable=False),
    sa.Column("table_ident", sa.String(length=255), nullable=False),
    sa.Column("run_id", sa.String(length=128), nullable=True),
    sa.Column("host", sa.String(length=255), nullable=True),
    sa.Column("pid", sa.Integer(), nullable=True),
    sa.Column("started_at", sa.Float(), nullable=False),
    sa.Column("heartbeat_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("run_key", "table_ident"),
)
sa.Table(
    "sources",
    _baseline,
    sa.Column("source_id", sa.String(length=255), nullable=False),
    sa.Column("kind", sa.String(length=64), nullable=True),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("format", sa.String(length=64), nullable=True),
    sa.Column("path", sa.Text(), nullable=True),
    sa.Column("bucket", sa.Text(), nullable=True),
    sa.Column("prefix", sa.Text(), nullable=True),
    sa.Column("glob", sa.Text(), nullable=True),
    sa.Column("endpoint_url", sa.Text(), nullable=True),
    sa.Column("read_mode", sa.String(length=64), nullable=True),
    sa.Column("csv_header", sa.Boolean(), nullable=True),
    sa.Column("columns", sa.Text(), nullable=True),
    sa.Column("limits", sa.Text(), nullable=True),
    sa.Column("promote_fields", sa.Text(), nullable=True),
    sa.Column("batch_files", sa.BigInteger(), nullable=True),
    sa.Column("max_files_per_run", sa.BigInteger(), nullable=True),
    sa.Column("max_bytes_per_run", sa.BigInteger(), nullable=True),
    sa.Column("download_threads", sa.BigInteger(), nullable=True),
    sa.Column("lineage_columns", sa.Boolean(), nullable=True),
    sa.Column("jdbc_url", sa.Text(), nullable=True),
    sa.Column("jdbc_url_env", sa.Text(), nullable=True),
    sa.Column("driver", sa.Text(), nullable=True),
    sa.Column("table", sa.Text(), nullable=True),
    sa.Column("query", sa.Text(), nullable=True),
    sa.Column("user_env", sa.Text(), nullable=True),
    sa.Column("password_env", sa.Text(), nullable=True),
    sa.Column("load_type", sa.String(length=64), nullable=True),
    sa.Column("partitioned", sa.Boolean(), nullable=True),
    sa.Column("primary_key", sa.Text(), nullable=True),
    sa.Column("watermark_column", sa.Text(), nullable=True),
    sa.Column("watermark_type", sa.String(length=64), nullable=True),
    sa.Column("partition_column", sa.Text(), nullable=True),
    sa.Column("partition_size_rows", sa.BigInteger(), nullable=True),
    sa.Column("max_partitions", sa.BigInteger(), nullable=True),
    sa.Column("fetchsize", sa.BigInteger(), nullable=True),
    sa.Column("table_identifier", sa.Text(), nullable=True),
    sa.Column("alternative_source_id", sa.Text(), nullable=True),
    sa.Column("options", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("source_id"),
)
sa.Table(
    "stages",
    _baseline,
    sa.Column("pipeline_id", sa.String(length=255), nullable=False),
    sa.Column("stage_order", sa.BigInteger(), nullable=False),
    sa.Column("stage_name", sa.Text(), nullable=True),
    sa.Column("layer", sa.String(length=64), nullable=True),
    sa.Column("source_id", sa.Text(), nullable=True),
    sa.Column("target_id", sa.Text(), nullable=True),
    sa.Column("transformation", sa.Text(), nullable=True),
    sa.Column("transformation_file", sa.Text(), nullable=True),
    sa.Column("validation_set_id", sa.Text(), nullable=True),
    sa.Column("retry_id", sa.Text(), nullable=True),
    sa.Column("enabled", sa.Boolean(), nullable=True),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("owner", sa.Text(), nullable=True),
    sa.Column("timeout_seconds", sa.BigInteger(), nullable=True),
    sa.PrimaryKeyConstraint("pipeline_id", "stage_order"),
)
sa.Table(
    "targets",
    _baseline,
    sa.Column("target_id", sa.String(length=255), nullable=False),
    sa.Column("kind", sa.String(length=64), nullable=True),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("namespace", sa.Text(), nullable=True),
    sa.Column("table", sa.Text(), nullable=True),
    sa.Column("partition_spec", sa.Text(), nullable=True),
    sa.Column("sort_order", sa.Text(), nullable=True),
    sa.Column("write_mode", sa.String(length=64), nullable=True),
    sa.Column("merge_keys", sa.Text(), nullable=True),
    sa.Column("table_properties", sa.Text(), nullable=True),
    sa.Column("export_target_id", sa.Text(), nullable=True),
    sa.Column("alternative_source_id", sa.Text(), nullable=True),
    sa.Column("jdbc_url", sa.Text(), nullable=True),
    sa.Column("jdbc_url_env", sa.Text(), nullable=True),
    sa.Column("user_env", sa.Text(), nullable=True),
    sa.Column("password_env", sa.Text(), nullable=True),
    sa.Column("warehouse_schema", sa.Text(), nullable=True),
    sa.Column("warehouse_table", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("target_id"),
)
sa.Table(
    "throttle_buckets",
    _baseline,
    sa.Column("bucket_key", sa.String(length=255), nullable=False),
    sa.Column("tokens", sa.Float(), nullable=False),
    sa.Column("updated_at", sa.Float(), nullable=False),
    sa.Column("rate_per_s", sa.Float(), nullable=False),
    sa.Column("capacity", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("bucket_key"),
)
sa.Table(
    "throttles",
    _baseline,
    sa.Column("throttle_id", sa.String(length=255), nullable=False),
    sa.Column("entity_type", sa.String(length=64), nullable=True),
    sa.Column("entity_id", sa.Text(), nullable=True),
    sa.Column("metric", sa.String(length=64), nullable=True),
    sa.Column("threshold", sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint("throttle_id"),
)
sa.Table(
    "validation_rules",
    _baseline,
    sa.Column("rule_set_id", sa.String(length=255), nullable=False),
    sa.Column("description", sa.Text(), nullable=True),
    sa.Column("rules", sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint("rule_set_id"),
)
sa.Table(
    "work_claims",
    _baseline,
    sa.Column("table_ident", sa.String(length=255), nullable=False),
    sa.Column("work_key", sa.String(length=768), nullable=False),
    sa.Column("version", sa.String(length=255), nullable=False),
    sa.Column("run_key", sa.String(length=64), nullable=False),
    sa.Column("claimed_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("table_ident", "work_key", "version"),
)
sa.Index("ix_work_claims_run", _baseline.tables["work_claims"].c.run_key, _baseline.tables["work_claims"].c.table_ident)


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    for table in _baseline.sorted_tables:
        if not inspector.has_table(table.name):
            table.create(bind)  # with its indexes
            continue
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have:  # a model field newer than the release that made the table
                op.add_column(table.name, sa.Column(column.name, column.type, nullable=True))
        have_ix = {ix["name"] for ix in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in have_ix:
                index.create(bind)


def downgrade() -> None:
    for table in reversed(_baseline.sorted_tables):
        op.drop_table(table.name)
