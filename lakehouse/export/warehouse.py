"""Gold export to the warehouse (Redshift in production, PostgreSQL as its stand-in).

After a gold Iceberg table is published, the same snapshot is copied into a staging table in the
warehouse (typed from the Iceberg/Spark schema, written in parallel by Spark over JDBC, or, for a
table within the Arrow engine's threshold, read by PyIceberg and inserted with parameterised
statements: no JVM, lakehouse.engines.choice.choose_for_export), its row
count is checked against the snapshot, and then one transaction renames the live table away,
renames the staging table into place and drops the old one. Readers therefore see the old table
or the new one, never a half-loaded one: in PostgreSQL and Redshift DDL is transactional and a
reader blocked on the rename re-resolves the name once the swap commits.

Why rename-swap rather than DELETE + INSERT: the swap is O(1) in the transaction, the new table
carries the current schema (columns added upstream appear without ALTERs), and it is the usual
Redshift pattern. The cost: grants and views bound to the old table do not follow it (re-grant
with default privileges; use late-binding views on Redshift).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from lakehouse.ingest.jdbc import JdbcConnection, engine_of
from lakehouse.settings import named_secret

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

    from lakehouse.metadata.model import Target
    from lakehouse.stage.core import StageContext, StageOutcome

log = logging.getLogger(__name__)

PG_ENGINES = ("postgresql", "redshift")
MAX_IDENT = 63  # PostgreSQL's NAMEDATALEN - 1 (Redshift allows 127)


class WarehouseExportError(RuntimeError):
    """The export failed; the live warehouse table is untouched (the swap never ran)."""


@dataclass
class ExportResult:
    target_id: str
    table: str
    rows: int
    duration_s: float
    replaced: bool
    columns: dict[str, str] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        """For materialization metadata: what was exported, no connection details."""
        return {"export_target": self.target_id, "export_table": self.table, "export_rows": self.rows,
                "export_duration_s": round(self.duration_s, 3)}


# --------------------------------------------------------------------------- types


def column_type(dt: DataType, engine: str) -> str:
    """Warehouse column type for a Spark (= Iceberg) type."""
    from pyspark.sql import types as T

    redshift = engine == "redshift"
    if isinstance(dt, T.BooleanType):
        return "boolean"
    if isinstance(dt, T.ByteType | T.ShortType):
        return "smallint"
    if isinstance(dt, T.IntegerType):
        return "integer"
    if isinstance(dt, T.LongType):
        return "bigint"
    if isinstance(dt, T.FloatType):
        return "real"
    if isinstance(dt, T.DoubleType):
        return "double precision"
    if isinstance(dt, T.DecimalType):
        return f"numeric({dt.precision},{dt.scale})"
    if isinstance(dt, T.DateType):
        return "date"
    if isinstance(dt, T.TimestampNTZType):
        return "timestamp"
    if isinstance(dt, T.TimestampType):
        return "timestamptz"
    if isinstance(dt, T.BinaryType):
        return "varbyte(1024000)" if redshift else "bytea"
    # strings, and nested types exported as JSON text
    return "varchar(65535)" if redshift else "text"


def _is_nested(dt: DataType) -> bool:
    from pyspark.sql import types as T

    return isinstance(dt, T.ArrayType | T.MapType | T.StructType)


# --------------------------------------------------------------------------- connections


def connection_for(target: Target) -> JdbcConnection:
    return JdbcConnection.resolve(target.jdbc_url, target.jdbc_url_env, None, target.user_env,
                                  target.password_env, label=f"warehouse target {target.target_id!r}")


def psycopg2_params(conn: JdbcConnection) -> dict[str, Any]:
    """host/port/dbname (+ sslmode etc.) from jdbc:postgresql:// or jdbc:redshift:// URLs."""
    engine = engine_of(conn.url)
    if engine not in PG_ENGINES:
        raise WarehouseExportError(f"{conn.label}: the warehouse export speaks the PostgreSQL protocol "
                                   f"(jdbc:postgresql or jdbc:redshift), not jdbc:{engine}")
    m = re.match(r"^jdbc:[a-z]+://([^/:?]+)(?::(\d+))?/([^?;]+)(?:[?;](.*))?$", conn.url, re.I)
    if not m:
        raise WarehouseExportError(f"{conn.label}: cannot parse host/port/database from the JDBC URL")
    params: dict[str, Any] = {"host": m.group(1), "port": int(m.group(2) or (5439 if engine == "redshift" else 5432)),
                              "dbname": m.group(3)}
    for k, v in parse_qsl(m.group(4) or "", keep_blank_values=True):
        if k in ("sslmode", "sslrootcert", "connect_timeout", "application_name"):
            params[k] = v
    if conn.user_env:
        params["user"] = named_secret(conn.user_env) or ""
    if conn.password_env:
        params["password"] = named_secret(conn.password_env) or ""
    return params


def _connect(conn: JdbcConnection):
    import psycopg2

    try:
        return psycopg2.connect(**psycopg2_params(conn))
    except psycopg2.Error as exc:
        raise WarehouseExportError(f"{conn.label}: cannot connect: {conn.scrub(str(exc)).strip()}") from None


# --------------------------------------------------------------------------- export


def _names(table: str, run_id: str) -> tuple[str, str]:
    tag = re.sub(r"[^a-z0-9]", "", run_id.lower())[:8] or "run"
    base = table[: MAX_IDENT - len("__lh_stage_") - len(tag)]
    return f"{base}__lh_stage_{tag}", f"{base}__lh_old_{tag}"


def export_frame(spark: SparkSession, df: DataFrame, target: Target, run_id: str,
                 expected_rows: int | None = None) -> ExportResult:
    """Load `df` into the warehouse table through a staging table and an atomic swap (Spark over JDBC)."""
    from pyspark.sql import functions as F

    conn = connection_for(target)
    engine = engine_of(conn.url)
    cols = {f.name: column_type(f.dataType, engine) for f in df.schema.fields}
    for f in df.schema.fields:
        if _is_nested(f.dataType):
            df = df.withColumn(f.name, F.to_json(F.col(f"`{f.name}`")))

    def load(pg, stage_ident) -> None:
        stage_text = stage_ident.as_string(pg)
        props = conn.properties()
        props["batchsize"] = "10000"
        if engine == "postgresql":
            props["reWriteBatchedInserts"] = "true"
        df.write.jdbc(conn.url, stage_text, mode="append", properties=props)

    return _export(conn, cols, load, target, run_id, expected_rows)


def export_arrow(data, schema, target: Target, run_id: str, expected_rows: int | None = None,
                 page_rows: int = 1000, batch_rows: int = 20_000) -> ExportResult:
    """Load Arrow data (a table or a RecordBatchReader, Spark schema `schema` for the column types)
    into the warehouse table through the same staging table and atomic swap, without a JVM:
    parameterised INSERTs (psycopg2 `execute_values`, identifiers quoted by `sql.Identifier`, values
    sent as parameters), nested columns as Spark's to_json text (lakehouse.engines.arrow.to_json), so both
    engines export the same rows. Streamed in batches of `batch_rows`: only one batch is ever held
    as Python values. Without `expected_rows`, the rows read are what the staging table must hold."""
    import pyarrow as pa
    from psycopg2 import sql
    from psycopg2.extras import execute_values

    from lakehouse.engines.arrow.to_json import to_json_column

    conn = connection_for(target)
    engine = engine_of(conn.url)
    cols = {f.name: column_type(f.dataType, engine) for f in schema.fields}
    nested = {f.name for f in schema.fields if _is_nested(f.dataType)}

    def load(pg, stage_ident) -> int:
        head = sql.SQL("INSERT INTO {} ({}) VALUES ").format(
            stage_ident, sql.SQL(", ").join(sql.Identifier(n) for n in cols)).as_string(pg)
        # a quoted name may hold "%": doubled, so only the VALUES placeholder is one
        query = head.replace("%", "%%") + "%s"
        batches = data.to_batches(max_chunksize=batch_rows) if isinstance(data, pa.Table) else data
        sent = 0
        with pg, pg.cursor() as cur:
            for batch in batches:
                values = [to_json_column(batch.column(n)).to_pylist() if n in nested else batch.column(n).to_pylist()
                          for n in cols]
                execute_values(cur, query, list(zip(*values, strict=True)), page_size=page_rows)
                sent += batch.num_rows
        return sent

    return _export(conn, cols, load, target, run_id, expected_rows)


def _export(conn: JdbcConnection, cols: dict[str, str], load, target: Target, run_id: str,
            expected_rows: int | None) -> ExportResult:
    """Staging table typed `cols`, filled by `load(pg, staging identifier)`, row count checked, swapped in."""
    from psycopg2 import sql

    t0 = time.monotonic()
    engine = engine_of(conn.url)
    schema = target.warehouse_schema or "public"
    table = target.warehouse_table
    stage, old = _names(table, run_id)
    ident = lambda name: sql.Identifier(schema, name)  # noqa: E731
    ddl = sql.SQL("CREATE TABLE {} ({})").format(
        ident(stage),
        sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in cols.items()),
    )
    pg = _connect(conn)
    try:
        with pg, pg.cursor() as cur:
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(stage)))
            cur.execute(ddl)
        try:
            sent = load(pg, ident(stage))
        except Exception as exc:  # noqa: BLE001 - the driver's message may echo connection properties
            raise WarehouseExportError(f"{conn.label}: loading staging table {schema}.{stage} failed: "
                                       f"{conn.scrub(str(exc))[:800]}") from None
        with pg, pg.cursor() as cur:
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(ident(stage)))
            rows = int(cur.fetchone()[0])
            if expected_rows is None:
                expected_rows = sent  # None when the loader cannot tell (Spark's JDBC write)
            if expected_rows is not None and rows != expected_rows:
                raise WarehouseExportError(
                    f"{conn.label}: staging table has {rows} rows but the Iceberg snapshot has {expected_rows}; "
                    f"{schema}.{table} was not replaced")
            # the swap: one transaction, readers see the old table or the new one
            cur.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
                        (schema, table))
            replaced = cur.fetchone() is not None
            if replaced:
                cur.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(ident(table), sql.Identifier(old)))
            cur.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(ident(stage), sql.Identifier(table)))
            if replaced:
                cur.execute(sql.SQL("DROP TABLE {}").format(ident(old)))
    except Exception:
        _drop_quietly(pg, ident(stage))
        raise
    finally:
        pg.close()
    result = ExportResult(target.target_id, f"{schema}.{table}", rows, time.monotonic() - t0, replaced, cols)
    log.info("exported %d rows to warehouse table %s (%s) in %.2fs", rows, result.table, engine, result.duration_s)
    return result


def _drop_quietly(pg, name) -> None:
    from psycopg2 import sql

    try:
        pg.rollback()
        with pg, pg.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))
    except Exception:  # noqa: BLE001 - best effort; the staging table name is unique per run
        log.warning("could not drop staging table after a failed export", exc_info=True)


def export_after_publish(runner: StageContext, outcome: StageOutcome) -> ExportResult:
    """Export the snapshot just published on main to the stage target's warehouse target."""
    from lakehouse.table.iceberg import quote

    wh = runner.catalog.target(runner.target.export_target_id)
    if wh.kind != "warehouse":
        raise WarehouseExportError(f"target {runner.target.target_id!r}: export_target_id "
                                   f"{wh.target_id!r} is not a warehouse target")
    from lakehouse.engines.choice import choose_for_export

    table = runner.platform.pyiceberg_catalog().load_table(runner.target.identifier)
    snap = table.snapshot_by_id(outcome.snapshot_id) if outcome.snapshot_id is not None else table.current_snapshot()
    size = int((snap.summary.additional_properties if snap is not None else {}).get("total-files-size", 0) or 0)
    choice = choose_for_export(runner.catalog, runner.target, size)
    chosen = {"export_engine": choice.engine, "export_engine_reason": choice.reason}
    try:
        if choice.engine == "arrow":
            from lakehouse.engines.types import iceberg_to_spark

            # pinned to the published snapshot, read by PyIceberg in batches: no JVM
            data = (table.scan(snapshot_id=snap.snapshot_id).to_arrow_batch_reader() if snap is not None
                    else table.schema().as_arrow().empty_table())
            summary = snap.summary.additional_properties if snap is not None else {}
            no_deletes = all(summary.get(k, "0") == "0" for k in ("total-position-deletes", "total-equality-deletes"))
            expected = int(summary["total-records"]) if no_deletes and "total-records" in summary else None
            result = export_arrow(data, iceberg_to_spark(table.schema()), wh, runner.run_id, expected_rows=expected)
        else:
            spark = runner.platform.spark()
            ns, tbl = runner.target.identifier.split(".", 1)
            reader = spark.read.format("iceberg")
            if outcome.snapshot_id is not None:
                reader = reader.option("snapshot-id", str(outcome.snapshot_id))
            df = reader.load(f"{quote(runner.platform.settings.catalog_name)}.{quote(ns)}.{quote(tbl)}")
            result = export_frame(spark, df, wh, runner.run_id, expected_rows=df.count())
    except Exception as exc:
        runner.audit("export_failed", outcome="failed", error_class=type(exc).__name__, message=str(exc)[:2000],
                     details={"export_target": wh.target_id, **chosen})
        raise
    outcome.extra.update({**result.metadata(), **chosen})
    runner.audit("exported", outcome="success", duration_ms=int(result.duration_s * 1000),
                 details={**result.metadata(), **chosen, "snapshot_id": outcome.snapshot_id, "replaced": result.replaced})
    return result
