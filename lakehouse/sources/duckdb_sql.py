"""SQL stages on DuckDB (`stages[].sql_engine: duckdb`): the stage's Spark SQL, transpiled by sqlglot,
runs in an in-process DuckDB over the upstream tables read through PyIceberg as Arrow, at the
snapshots the run pinned (lakehouse.stage.pins), so a small roll-up pays no Spark job for its query.

Two halves behind small functions, so the write side can change without touching the query side:
* `query_arrow`: pinned upstream snapshots -> PyIceberg scan -> Arrow -> DuckDB -> an Arrow table;
* the write: when the target's engine is `arrow`, or `auto` and the pinned upstreams' data files
  are within its threshold (lakehouse.engines.choice), the Arrow table goes to the Arrow write engine
  (lakehouse.engines.arrow: PyIceberg, no JVM); otherwise `to_spark` makes it a Spark DataFrame. Either
  way the same write-audit-publish service takes it (audit branch, rules, quarantine, kill-switch
  re-check, publish, checkpoints).

The same SQL must give the same rows on both engines: sqlglot transpiles Spark's dialect to DuckDB's
(with the rewrites that make DuckDB answer as Spark, and the refusals, of lakehouse.sql.parse.to_duckdb),
and SQL it cannot carry over (an unsupported construct, a function it does not know for DuckDB) is
refused when the metadata is validated (lakehouse.sql.parse.duckdb_problem, from
lakehouse.metadata.checks), not mid-run. The upstream snapshots are read into memory: the engine
is meant for small upstream tables (a gold roll-up over a modest silver table). DuckDB's session time zone is set to Spark's (spark.sql.session.timeZone, UTC by default),
so casting a timestamp to a date gives the same day on both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lakehouse.sql.parse import to_duckdb

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse.stage.core import ExtractPlan, StageContext

#: the time zone DuckDB evaluates timestamps in when the Spark session's is not known
DEFAULT_TIME_ZONE = "UTC"


def connect(time_zone: str = DEFAULT_TIME_ZONE):
    """An in-memory DuckDB connection that sees only the Arrow tables registered on it: no file,
    network or extension access (what SQL from metadata may do stays inside the pinned tables),
    timestamps in `time_zone`, results in the rows' order."""
    import duckdb

    con = duckdb.connect(config={"enable_external_access": False, "autoload_known_extensions": False,
                                 "autoinstall_known_extensions": False})
    # the zone as a quoted literal, not a bound parameter: DuckDB's Python binding imports pandas to
    # inspect a parameter, ~300 modules an Arrow-only run does not load (lakehouse.runtime.pyarrow_probes)
    from sqlglot import exp

    con.execute(f"SET TimeZone = {exp.Literal.string(time_zone).sql(dialect='duckdb')}")
    con.execute("SET preserve_insertion_order = true")
    return con


def query_arrow(sql: str, tables: Mapping[str, pa.Table], time_zone: str = DEFAULT_TIME_ZONE) -> pa.Table:
    """Run Spark SQL `sql` on DuckDB with `tables` (name in the SQL -> Arrow table) as its relations."""
    con = connect(time_zone)
    try:
        for name, table in tables.items():
            con.register(name, table)
        return con.execute(to_duckdb(sql)).fetch_arrow_table()
    finally:
        con.close()


def pinned_arrow(ctx: StageContext, plan: ExtractPlan) -> dict[str, pa.Table]:
    """identifier -> each upstream at the snapshot the run pinned, read through PyIceberg (a replica
    recovery swapped in is read in its place, as on Spark)."""
    catalog = ctx.platform.pyiceberg_catalog()
    overrides = plan.details.get("table_overrides", {})
    out = {}
    for ident, snap in plan.upstream_snapshots.items():
        table = catalog.load_table(overrides.get(ident, ident))
        out[ident] = table.scan(snapshot_id=snap).to_arrow() if snap is not None else table.scan().to_arrow()
    return out


def to_spark(spark: SparkSession, table: pa.Table) -> DataFrame:
    """The Arrow result as a Spark DataFrame for the write-audit-publish service (Spark 3.5 takes
    pandas, not Arrow: the schema is given from Arrow's, so nullable integers stay integers)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = from_arrow_schema(table.schema)
    previous = spark.conf.get("spark.sql.execution.arrow.pyspark.enabled", "false")
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    try:
        return spark.createDataFrame(table.to_pandas(), schema=schema)
    finally:
        spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", previous)


def stage_arrow(ctx: StageContext, plan: ExtractPlan, time_zone: str) -> pa.Table:
    """The stage's SQL on DuckDB over its pinned upstreams, as an Arrow table."""
    from lakehouse.sql.parse import rewrite_tables

    tables = pinned_arrow(ctx, plan)
    names = {ident: "__lh_" + ident.replace(".", "__") for ident in tables}
    sql = rewrite_tables(ctx.stage.transformation, {i.lower(): n for i, n in names.items()})
    result = query_arrow(sql, {names[i]: t for i, t in tables.items()}, time_zone)
    ctx.report["sql_engine"] = "duckdb"
    return result


def run_stage_sql(ctx: StageContext, plan: ExtractPlan) -> DataFrame:
    """The stage's SQL on DuckDB over its pinned upstreams, as a DataFrame for a load on Spark."""
    spark = ctx.platform.spark()
    return to_spark(spark, stage_arrow(ctx, plan, spark.conf.get("spark.sql.session.timeZone", DEFAULT_TIME_ZONE)))
