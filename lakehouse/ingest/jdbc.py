"""Database sources over JDBC: full, incremental (watermark) and partitioned (range) loads.

`plan()` runs in the extract op (pool ``source:<id>``) and does every source-side read: the new
high watermark, the table's size, the split into ranges, and the copy itself, staged as Parquet
under the staging dir. `batches()` runs in the load op and hands the staged rows to the runner
as one Iceberg commit whose snapshot properties carry the new watermark. The watermark is read
back from main's snapshot history on the next run, so it advances exactly when (and only if) the
rows are published: a crash anywhere before that re-reads the same window, and MERGE by primary
key makes the re-read idempotent.

Credentials are references: ``user_env`` / ``password_env`` name environment variables read at the
moment a connection is opened. Nothing built here (plan details, snapshot properties, log lines)
ever holds the password, because the plan is pickled by Dagster's IO manager.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.control import faults
from lakehouse.settings import named_secret
from lakehouse.stage.core import Batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse.metadata.model import Source
    from lakehouse.stage.core import ExtractPlan, StageContext, StageOutcome

log = logging.getLogger(__name__)

WATERMARK_PROPERTY = "lakehouse.jdbc.watermark"
SOURCE_PROPERTY = "lakehouse.jdbc.source"
#: A range holding more than SKEW_FACTOR / N of the rows makes the planner switch to quantile ranges.
DEFAULT_SKEW_FACTOR = 2.0
DEFAULT_QUANTILE_SAMPLE_ROWS = 200_000

DRIVERS = {
    "postgresql": "org.postgresql.Driver",
    "redshift": "com.amazon.redshift.jdbc42.Driver",
    "sqlserver": "com.microsoft.sqlserver.jdbc.SQLServerDriver",
    "oracle": "oracle.jdbc.OracleDriver",
    "mysql": "com.mysql.cj.jdbc.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
    "sqlite": "org.sqlite.JDBC",
}


class JdbcSourceError(RuntimeError):
    """A JDBC source is misconfigured or unreachable; the message names the source and the fix."""


# --------------------------------------------------------------------------- dialects


@dataclass(frozen=True)
class Dialect:
    """What differs between engines in the few statements the planner writes itself."""

    name: str
    quote_open: str = '"'
    quote_close: str = '"'
    quantiles: str = "ntile"  # "percentile_array" (PostgreSQL) or "ntile" (ANSI window function)
    cast_literals: bool = False  # SQL Server has no DATE '...' literal

    def quote(self, ident: str) -> str:
        if "\x00" in ident:
            raise JdbcSourceError(f"identifier {ident!r} contains a NUL character")
        return self.quote_open + ident.replace(self.quote_close, self.quote_close * 2) + self.quote_close

    def quote_path(self, dotted: str) -> str:
        """schema.table (each part quoted); a part may itself be "quoted" to contain a dot."""
        return ".".join(self.quote(p) for p in split_dotted(dotted))

    def literal(self, value: Any) -> str:
        """A SQL literal for a watermark / range bound we read from the source ourselves."""
        if isinstance(value, bool):
            raise JdbcSourceError("boolean columns cannot be watermarks or partition columns")
        if isinstance(value, int | Decimal):
            return str(value)
        if isinstance(value, float):
            return repr(value)
        if isinstance(value, datetime):
            text = _naive_utc(value).strftime("%Y-%m-%d %H:%M:%S.%f")
            return f"CAST('{text}' AS DATETIME2)" if self.cast_literals else f"TIMESTAMP '{text}'"
        if isinstance(value, date):
            text = value.isoformat()
            return f"CAST('{text}' AS DATE)" if self.cast_literals else f"DATE '{text}'"
        raise JdbcSourceError(f"unsupported watermark/partition value type {type(value).__name__}")


DIALECTS = {
    "postgresql": Dialect("postgresql", quantiles="percentile_array"),
    "redshift": Dialect("redshift"),
    "oracle": Dialect("oracle"),
    "sqlserver": Dialect("sqlserver", "[", "]", cast_literals=True),
    "mysql": Dialect("mysql", "`", "`"),
    "mariadb": Dialect("mariadb", "`", "`"),
}


def engine_of(url: str) -> str:
    m = re.match(r"^jdbc:([a-z0-9]+):", url, re.I)
    if not m:
        raise JdbcSourceError(f"{_redact_url(url)!r} is not a JDBC URL (expected jdbc:<engine>:...)")
    return m.group(1).lower()


def dialect_for(url: str) -> Dialect:
    return DIALECTS.get(engine_of(url), Dialect(engine_of(url)))


def split_dotted(dotted: str) -> list[str]:
    parts, cur, quoted, i = [], "", False, 0
    while i < len(dotted):
        ch = dotted[i]
        if ch == '"':
            if quoted and i + 1 < len(dotted) and dotted[i + 1] == '"':
                cur += '"'
                i += 2
                continue
            quoted = not quoted
        elif ch == "." and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    parts.append(cur)
    if quoted or any(p == "" for p in parts):
        raise JdbcSourceError(f"table name {dotted!r} is malformed (empty part or unbalanced quote)")
    return parts


def _redact_url(url: str) -> str:
    return re.sub(r"(?i)(password|pwd|secret|token)=[^&;]*", r"\1=***", url)


def _naive_utc(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


# --------------------------------------------------------------------------- connection


class _SecretScrubber(logging.Filter):
    """py4j logs every command sent to the JVM at DEBUG, options (and so passwords) included."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            if any(s in msg for s in self.secrets):
                for s in self.secrets:
                    msg = msg.replace(s, "***")
                record.msg, record.args = msg, None
        return True


_SCRUBBER = _SecretScrubber()
PY4J_LOGGERS = ("py4j", "py4j.clientserver", "py4j.java_gateway", "py4j.protocol")


def register_secret(value: str | None) -> None:
    """Scrub `value` from py4j's log records before any handler sees them."""
    if not value or value in _SCRUBBER.secrets:
        return
    _SCRUBBER.secrets.add(value)
    for name in PY4J_LOGGERS:
        lg = logging.getLogger(name)
        if _SCRUBBER not in lg.filters:
            lg.addFilter(_SCRUBBER)


@dataclass(frozen=True)
class JdbcConnection:
    """Where and how to connect. Holds env var NAMES only; secrets are read at use time."""

    url: str
    driver: str
    user_env: str | None
    password_env: str | None
    fetchsize: int = 10_000
    label: str = ""

    @classmethod
    def for_source(cls, src: Source) -> JdbcConnection:
        return cls.resolve(src.jdbc_url, src.jdbc_url_env, src.driver, src.user_env, src.password_env,
                           fetchsize=src.fetchsize, label=f"source {src.source_id!r}")

    @classmethod
    def resolve(cls, url: str | None, url_env: str | None, driver: str | None, user_env: str | None,
                password_env: str | None, *, fetchsize: int = 10_000, label: str = "") -> JdbcConnection:
        if url_env:
            resolved = named_secret(url_env)
            if not resolved:
                raise JdbcSourceError(f"{label}: environment variable {url_env!r} (jdbc_url_env) is not set")
            url = resolved
        if not url:
            raise JdbcSourceError(f"{label}: no JDBC URL (set jdbc_url or jdbc_url_env)")
        if re.search(r"(?i)(password|pwd)=", url):
            raise JdbcSourceError(f"{label}: the JDBC URL must not carry a password; use password_env")
        engine = engine_of(url)
        driver = driver or DRIVERS.get(engine)
        if not driver:
            raise JdbcSourceError(f"{label}: no known driver class for jdbc:{engine}; set driver in metadata")
        for what, name in (("user_env", user_env), ("password_env", password_env)):
            if name and named_secret(name) is None:
                raise JdbcSourceError(f"{label}: environment variable {name!r} ({what}) is not set")
        return cls(url, driver, user_env, password_env, fetchsize, label)

    @property
    def dialect(self) -> Dialect:
        return dialect_for(self.url)

    def properties(self) -> dict[str, str]:
        """Driver properties including the secret: pass straight to Spark, never store or log."""
        # timestamp WITHOUT time zone stays a wall-clock value (Iceberg `timestamp`), never shifted by a zone
        props = {"driver": self.driver, "fetchsize": str(self.fetchsize), "preferTimestampNTZ": "true"}
        if self.user_env:
            props["user"] = named_secret(self.user_env) or ""
        if self.password_env:
            props["password"] = named_secret(self.password_env) or ""
            register_secret(props["password"])
        return props

    def reader(self, spark: SparkSession):
        r = spark.read.format("jdbc").option("url", self.url)
        for k, v in self.properties().items():
            r = r.option(k, v)
        return r

    def query(self, spark: SparkSession, sql: str) -> list:
        """Run a small source-side query (stats, watermark, quantiles) through the same driver."""
        try:
            return self.reader(spark).option("query", sql).load().collect()
        except Exception as exc:  # noqa: BLE001 - re-raised with context, secrets scrubbed
            raise JdbcSourceError(f"{self.label}: query failed on {_redact_url(self.url)}: "
                                  f"{self.scrub(str(exc))[:800]}") from None

    def scrub(self, text: str) -> str:
        secret = named_secret(self.password_env)
        return text.replace(secret, "***") if secret else text


# --------------------------------------------------------------------------- watermarks


def encode_watermark(value: Any) -> str:
    if isinstance(value, datetime):
        return json.dumps({"type": "timestamp", "value": _naive_utc(value).isoformat()})
    if isinstance(value, date):
        return json.dumps({"type": "date", "value": value.isoformat()})
    if isinstance(value, int | Decimal):
        return json.dumps({"type": "int", "value": str(value)})
    raise JdbcSourceError(f"unsupported watermark value type {type(value).__name__}")


def decode_watermark(text: str | None) -> Any:
    if not text:
        return None
    obj = json.loads(text)
    kind, value = obj["type"], obj["value"]
    if kind == "timestamp":
        return datetime.fromisoformat(value)
    if kind == "date":
        return date.fromisoformat(value)
    return Decimal(value) if "." in value else int(value)


def watermark_order(encoded: str) -> float:
    """An encoded watermark on a number line (for the publish-time overlap check)."""
    return to_number(decode_watermark(encoded))


def remainder(plan: ExtractPlan, overlap) -> ExtractPlan | None:
    """What is left of a planned window once another run published rows up to `overlap.watermark`:
    the staged rows above it (re-merging the rest by primary key would change nothing)."""
    import dataclasses

    high = plan.details.get("watermark_high")
    if overlap.watermark is None or high is None or watermark_order(overlap.watermark) >= watermark_order(high):
        return None
    details = {**plan.details, "watermark_last": overlap.watermark, "remainder_after": overlap.watermark}
    return dataclasses.replace(plan, details=details)


def last_watermark(runner: StageContext) -> Any:
    """The watermark committed with main's newest snapshot that carries one (None: first load)."""
    from lakehouse.table.iceberg import MAIN, sql_string

    tables = runner.platform.tables()
    ident = runner.target.identifier
    if not tables.exists(ident):
        return None
    head = tables.snapshot_id(ident, MAIN)
    if head is None:
        return None
    rows = tables.spark.sql(
        f"SELECT snapshot_id, parent_id, summary[{sql_string(WATERMARK_PROPERTY)}] AS wm "
        f"FROM {tables.metadata_table(ident, 'snapshots')}"
    ).collect()
    parent = {r["snapshot_id"]: r["parent_id"] for r in rows}
    marks = {r["snapshot_id"]: r["wm"] for r in rows}
    cur = head
    while cur is not None and cur in parent:
        if marks.get(cur):
            return decode_watermark(marks[cur])
        cur = parent[cur]
    return None


# --------------------------------------------------------------------------- SQL pieces


def relation(src: Source, d: Dialect) -> str:
    """The source as a FROM item: a quoted table, or the metadata's query as a derived table."""
    if src.table:
        return d.quote_path(src.table)
    q = src.query.strip().rstrip(";")
    return f"({q}) lh_src"


def window_filter(src: Source, d: Dialect, last: Any, high: Any) -> str | None:
    """watermark > last AND watermark <= high; the first load also takes rows with no watermark."""
    if src.load_type != "incremental" or high is None:
        return None
    col = d.quote(src.watermark_column)
    if last is None:
        return f"({col} <= {d.literal(high)} OR {col} IS NULL)"
    return f"({col} > {d.literal(last)} AND {col} <= {d.literal(high)})"


def windowed_relation(src: Source, d: Dialect, last: Any, high: Any) -> str:
    """A derived table Spark can read with or without range predicates."""
    where = window_filter(src, d, last, high)
    base = f"SELECT * FROM {relation(src, d)}"
    return f"({base}{' WHERE ' + where if where else ''}) lh_q"


# --------------------------------------------------------------------------- ranges


def to_number(value: Any) -> float:
    """Dates and timestamps on a number line (days / microseconds) for range arithmetic."""
    if isinstance(value, datetime):
        return (_naive_utc(value) - datetime(1970, 1, 1)) / timedelta(microseconds=1)
    if isinstance(value, date):
        return float((value - date(1970, 1, 1)).days)
    return float(value)


def from_number(x: float, like: Any) -> Any:
    """Inverse of to_number for a value of the same type as `like` (rounded to the unit)."""
    if isinstance(like, datetime):
        return datetime(1970, 1, 1) + timedelta(microseconds=round(x))
    if isinstance(like, date):
        return date(1970, 1, 1) + timedelta(days=round(x))
    return round(x)


def num_partitions(rows: int, partition_size_rows: int, max_partitions: int) -> int:
    return max(1, min(max_partitions, math.ceil(rows / partition_size_rows)))


def uniform_edges(lo: Any, hi: Any, n: int) -> list[float]:
    """Spark's JDBC range split: stride = (upper - lower) / n over [lo, hi]."""
    a, b = to_number(lo), to_number(hi)
    return [a + (b - a) * i / n for i in range(1, n)]


def estimate_shares(edges: list[float], cdf_points: list[tuple[float, float]]) -> list[float]:
    """Share of rows per range, given inner edges and an empirical CDF (piecewise linear)."""

    def cdf(x: float) -> float:
        if x <= cdf_points[0][0]:
            return 0.0
        for (x0, y0), (x1, y1) in zip(cdf_points, cdf_points[1:], strict=False):
            if x <= x1:
                return y0 + (y1 - y0) * ((x - x0) / (x1 - x0) if x1 > x0 else 1.0)
        return 1.0

    cuts = [0.0, *(cdf(e) for e in edges), 1.0]
    return [max(0.0, b - a) for a, b in zip(cuts, cuts[1:], strict=False)]


def quantile_cuts(conn: JdbcConnection, spark: SparkSession, src: Source, last: Any, high: Any,
                  n: int, non_null: int) -> list[Any]:
    """n-1 approximate quantiles of the partition column, computed in the database."""
    d = conn.dialect
    col = d.quote(src.partition_column)
    rel = windowed_relation(src, d, last, high)
    sample_rows = int(src.options.get("quantile_sample_rows", DEFAULT_QUANTILE_SAMPLE_ROWS))
    fractions = [i / n for i in range(1, n)]
    if d.quantiles == "percentile_array":
        sample = ""
        if non_null > sample_rows:
            sample = f" AND random() < {sample_rows / non_null:.6f}"
        arr = ", ".join(f"{f:.6f}" for f in fractions)
        rows = conn.query(spark, f"SELECT percentile_disc(ARRAY[{arr}]::float8[]) WITHIN GROUP (ORDER BY {col}) "
                                 f"AS q FROM {rel} WHERE {col} IS NOT NULL{sample}")
        return list(rows[0]["q"] or []) if rows else []
    # ANSI: ntile over the (filtered) column; the upper edge of each tile is a cut.
    rows = conn.query(spark, f"SELECT MAX(c) AS q FROM (SELECT {col} AS c, NTILE({n}) OVER (ORDER BY {col}) AS b "
                             f"FROM {rel} WHERE {col} IS NOT NULL) t GROUP BY b ORDER BY b")
    return [r["q"] for r in rows][:-1]


def range_predicates(d: Dialect, column: str, cuts: list[Any]) -> list[str]:
    """Half-open ranges at the cuts; nulls go with the first range so none is lost."""
    col = d.quote(column)
    lits = [d.literal(c) for c in cuts]
    if not lits:
        return ["1=1"]
    preds = [f"{col} < {lits[0]} OR {col} IS NULL"]
    preds += [f"{col} >= {a} AND {col} < {b}" for a, b in zip(lits, lits[1:], strict=False)]
    preds.append(f"{col} >= {lits[-1]}")
    return preds


def plan_ranges(conn: JdbcConnection, spark: SparkSession, src: Source, last: Any, high: Any) -> dict[str, Any]:
    """How to split the read: single query, Spark's uniform ranges, or quantile ranges."""
    d = conn.dialect
    col = d.quote(src.partition_column)
    rel = windowed_relation(src, d, last, high)
    stats = conn.query(spark, f"SELECT COUNT(*) AS n, COUNT({col}) AS nn, MIN({col}) AS lo, MAX({col}) AS hi FROM {rel}")[0]
    rows, non_null, lo, hi = int(stats["n"]), int(stats["nn"]), stats["lo"], stats["hi"]
    n = num_partitions(rows, src.partition_size_rows, src.max_partitions)
    out: dict[str, Any] = {"rows_estimate": rows, "null_partition_values": rows - non_null,
                           "num_partitions": n, "mode": "single"}
    if n <= 1 or lo is None or lo == hi:
        out["num_partitions"] = 1
        return out
    if isinstance(lo, float | Decimal) and not isinstance(lo, int):
        if isinstance(lo, Decimal) and lo == lo.to_integral_value() and hi == hi.to_integral_value():
            lo, hi = int(lo), int(hi)
        else:
            raise JdbcSourceError(f"source {src.source_id!r}: partition_column {src.partition_column!r} must be "
                                  "an integer, date or timestamp column")
    cuts = quantile_cuts(conn, spark, src, last, high, n, non_null)
    cuts = sorted({c for c in cuts if c is not None and lo < c <= hi}, key=to_number)
    cdf = [(to_number(lo), 0.0)] + [(to_number(c), (i + 1) / n) for i, c in enumerate(cuts)] + [(to_number(hi), 1.0)]
    cdf = sorted(dict(cdf).items())
    uniform = estimate_shares(uniform_edges(lo, hi, n), cdf)
    quantile = estimate_shares([to_number(c) for c in cuts], cdf)
    out["estimated_max_share_uniform"] = round(max(uniform), 4)
    out["estimated_max_share_quantile"] = round(max(quantile), 4) if cuts else 1.0
    skew = float(src.options.get("skew_factor", DEFAULT_SKEW_FACTOR))
    strategy = src.options.get("partition_strategy", "auto")  # auto | uniform | quantile
    if strategy not in ("auto", "uniform", "quantile"):
        raise JdbcSourceError(f"source {src.source_id!r}: options.partition_strategy {strategy!r} must be "
                              "auto, uniform or quantile")
    if d.quote_close in src.partition_column and cuts:
        strategy = "quantile"  # Spark re-quotes partitionColumn without escaping: use our own predicates
    if strategy == "quantile" or (strategy == "auto" and max(uniform) > skew / n and cuts):
        out["mode"] = "predicates"
        out["split"] = "quantile"
        out["predicates"] = range_predicates(d, src.partition_column, cuts)
        out["num_partitions"] = len(out["predicates"])
    elif isinstance(lo, datetime) or (src.max_parallel_queries and n > src.max_parallel_queries):
        # Spark 3.5 refuses timestamp_ntz as partitionColumn, and a capped read runs its partitions
        # in waves (read_waves): the same stride ranges, as predicates
        edges = sorted({from_number(e, lo) for e in uniform_edges(lo, hi, n)} - {lo})
        out["mode"] = "predicates"
        out["split"] = "uniform"
        out["predicates"] = range_predicates(d, src.partition_column, edges)
        out["num_partitions"] = len(out["predicates"])
    else:
        out["mode"] = "bounds"
        out["split"] = "uniform"
        out["lower_bound"] = _bound(lo)
        out["upper_bound"] = _bound(hi, upper=True)
    return out


def _bound(value: Any, upper: bool = False) -> str:
    """Spark's lowerBound/upperBound text (the upper bound is exclusive in the stride math only)."""
    if isinstance(value, datetime):
        return _naive_utc(value).strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    return str(int(value) + (1 if upper else 0))


# --------------------------------------------------------------------------- reading


def waves(src: Source, details: dict[str, Any]) -> list[list[str]] | None:
    """The planned partition predicates in waves of `max_parallel_queries` (None: one read of them all).

    Spark's JDBC reader runs one query per partition task, as many at once as the cluster has task
    slots; a connection pool bounds runs, not the tasks of one read. A capped read therefore reads
    its partitions a wave at a time: each wave is one Spark JDBC read over at most N predicates,
    staged (appended to the run's Parquet copy) before the next starts, so at most N queries are
    ever open against the source for this read."""
    ranges = details.get("ranges") or {}
    cap = src.max_parallel_queries
    if not cap or ranges.get("mode") != "predicates" or len(ranges["predicates"]) <= cap:
        return None
    preds = ranges["predicates"]
    return [preds[i:i + cap] for i in range(0, len(preds), cap)]


def read_source(spark: SparkSession, conn: JdbcConnection, src: Source, details: dict[str, Any],
                predicates: list[str] | None = None) -> DataFrame:
    """The DataFrame over the source window, split as planned (`predicates`: one wave of them)."""
    d = conn.dialect
    last = decode_watermark(details.get("watermark_last"))
    high = decode_watermark(details.get("watermark_high"))
    rel = windowed_relation(src, d, last, high)
    ranges = details.get("ranges") or {"mode": "single"}
    if ranges["mode"] == "predicates":
        props = conn.properties()
        return spark.read.jdbc(conn.url, rel, predicates=predicates or ranges["predicates"], properties=props)
    reader = conn.reader(spark).option("dbtable", rel)
    odd = [c for c in reader.load().columns if d.quote_close in c]
    if odd:  # Spark projects columns by pasting them in quotes unescaped
        raise JdbcSourceError(f"source {src.source_id!r}: column name(s) {odd} contain {d.quote_close!r}, which "
                              "Spark's JDBC reader cannot quote; rename them with an alias in `query:`")
    if ranges["mode"] == "bounds":
        reader = (reader.option("partitionColumn", d.quote(src.partition_column))
                  .option("lowerBound", ranges["lower_bound"]).option("upperBound", ranges["upper_bound"])
                  .option("numPartitions", str(ranges["num_partitions"])))
    return reader.load()


def staging_path(runner: StageContext, src: Source) -> Path:
    return runner.platform.settings.staging_dir / "jdbc" / src.source_id / runner.run_id


def check_write_mode(runner: StageContext, src: Source) -> None:
    t = runner.target
    if src.load_type == "incremental":
        if t.write_mode != "merge":
            raise JdbcSourceError(
                f"source {src.source_id!r} is incremental but target {t.target_id!r} has write_mode "
                f"{t.write_mode!r}: set write_mode: merge and merge_keys: {src.primary_key} so re-read rows "
                "update instead of duplicating")
        if [k.lower() for k in t.merge_keys] != [k.lower() for k in src.primary_key]:
            raise JdbcSourceError(f"target {t.target_id!r} merge_keys {t.merge_keys} differ from source "
                                  f"{src.source_id!r} primary_key {src.primary_key}")
    elif t.write_mode not in ("overwrite", "merge"):
        raise JdbcSourceError(
            f"source {src.source_id!r} is a full load but target {t.target_id!r} has write_mode "
            f"{t.write_mode!r}: use overwrite (atomic replace) so a re-run does not duplicate the table")


def check_watermark_type(src: Source, value: Any) -> None:
    """The declared watermark_type must match what the column holds (a string column cannot be one)."""
    if value is None:
        return
    kind = ("timestamp" if isinstance(value, datetime) else "date" if isinstance(value, date)
            else "int" if isinstance(value, int | Decimal) and not isinstance(value, bool) else None)
    if kind is None:
        raise JdbcSourceError(f"source {src.source_id!r}: watermark_column {src.watermark_column!r} holds "
                              f"{type(value).__name__} values; it must be an int, date or timestamp column")
    if src.watermark_type and src.watermark_type != kind:
        raise JdbcSourceError(f"source {src.source_id!r}: watermark_type is {src.watermark_type!r} but column "
                              f"{src.watermark_column!r} holds {kind} values")


def plan(runner: StageContext, src: Source, plan: ExtractPlan) -> None:
    """Source-side work in the source's pool: window, ranges, and the copy (staged as Parquet)."""
    check_write_mode(runner, src)
    conn = JdbcConnection.for_source(src)
    spark = runner.platform.spark()
    d = conn.dialect
    details: dict[str, Any] = {"engine": engine_of(conn.url), "load_type": src.load_type,
                               "relation": src.table or "query", "partitioned": src.partitioned}
    last = high = None
    if src.load_type == "incremental":
        last = last_watermark(runner)
        col = d.quote(src.watermark_column)
        high = conn.query(spark, f"SELECT MAX({col}) AS hi FROM {relation(src, d)}")[0]["hi"]
        check_watermark_type(src, high)
        details["watermark_last"] = encode_watermark(last) if last is not None else None
        details["watermark_high"] = encode_watermark(high) if high is not None else None
        if high is None or (last is not None and to_number(high) <= to_number(last)):
            plan.details = details
            plan.skipped_reason = (f"no new rows in source {src.source_id!r}: max({src.watermark_column}) = "
                                   f"{high} <= committed watermark {last}")
            return
    taken = claim_window(runner, src, details)
    if taken:
        plan.details = details
        plan.skipped_reason = taken
        return
    if src.partitioned:
        details["ranges"] = plan_ranges(conn, spark, src, last, high)
    plan.details = details
    if src.options.get("staging", "true").lower() in ("false", "0", "no"):
        return  # read in the load step instead (no local copy; source I/O then runs in the target's pool)
    path = staging_path(runner, src)
    if path.exists():
        shutil.rmtree(path)
    parts = waves(src, details)
    if parts:
        details["waves"] = len(parts)
        details["max_parallel_queries"] = src.max_parallel_queries
    for wave, preds in enumerate(parts or [None]):
        df = read_source(spark, conn, src, details, preds)
        # Parquet refuses some column names (spaces, ',;{}()=') that databases and Iceberg allow:
        # stage under positional names and restore the real ones when loading.
        details["columns"] = list(df.columns)
        df = df.toDF(*[f"c{i}" for i in range(len(df.columns))])
        try:  # a capped read: wave after wave, each staged before the next one's queries start
            df.write.mode("overwrite" if wave == 0 else "append").parquet(str(path))
        except Exception as exc:  # noqa: BLE001 - the driver's message may echo connection properties
            raise JdbcSourceError(f"source {src.source_id!r}: reading {_redact_url(conn.url)} failed: "
                                  f"{conn.scrub(str(exc))[:800]}") from None
    plan.staged_path = str(path)
    details["rows_read"] = spark.read.parquet(str(path)).count()
    runner.log.info("jdbc source %s: staged %d rows (%s, %s)", src.source_id, details["rows_read"],
                    src.load_type, (details.get("ranges") or {}).get("mode", "single"))


def claim_window(runner: StageContext, src: Source, details: dict[str, Any]) -> str | None:
    """Claim "the rows after the committed watermark" for this run (lakehouse.runtime.coordination);
    the reason to skip when a live run is already reading them, else None."""
    from lakehouse.runtime import coordination

    if not coordination.claims_enabled(runner.catalog):
        return None
    incremental = src.load_type == "incremental"
    version = (details.get("watermark_last") or "first-load") if incremental else "full-load"
    res = coordination.claim(runner.platform, runner.target.identifier, runner.run_id,
                             [(f"jdbc:{src.source_id}", version)])
    if res.mine:
        return None
    runner.audit("window_claimed_elsewhere", outcome="skipped", message=res.message())
    what = (f"the rows after watermark {decode_watermark(details.get('watermark_last'))}" if incremental
            else "a full load")
    return f"source {src.source_id!r}: {what} is being loaded by run {', '.join(res.taken)}"


def batches(runner: StageContext, plan: ExtractPlan):
    """One commit: the staged window, with the watermark it reaches as a snapshot property."""
    src = runner.source
    spark = runner.platform.spark()
    if plan.staged_path:
        df = spark.read.parquet(plan.staged_path)
        if plan.details.get("columns"):
            df = df.toDF(*plan.details["columns"])
    else:
        df = read_source(spark, JdbcConnection.for_source(src), src, plan.details)
    if plan.details.get("remainder_after"):  # another run published the rows up to this watermark
        from pyspark.sql import functions as F

        from lakehouse.table.iceberg import quote

        df = df.where(F.col(quote(src.watermark_column)) > F.lit(decode_watermark(plan.details["remainder_after"])))
    faults.inject("after_jdbc_read", runner, source_id=src.source_id, df=df)
    props = {SOURCE_PROPERTY: src.source_id, "lakehouse.jdbc.load_type": src.load_type,
             "lakehouse.run_id": runner.run_id}
    if plan.details.get("watermark_high"):
        props[WATERMARK_PROPERTY] = plan.details["watermark_high"]
    label = f"jdbc {src.load_type}" + (f" ({plan.details['ranges']['mode']})" if plan.details.get("ranges") else "")
    batch = Batch(df, props, label=label)
    yield batch


def after_publish(runner: StageContext, plan: ExtractPlan, outcome: StageOutcome) -> None:
    """Say what was read (MERGE's added-records counts rewritten rows too) and drop the staged copy."""
    d = plan.details
    if "rows_read" in d:
        outcome.extra["source_rows_read"] = d["rows_read"]
    if d.get("watermark_high"):
        outcome.extra["watermark"] = str(decode_watermark(d["watermark_high"]))
    if d.get("ranges"):
        outcome.extra["read_ranges"] = f"{d['ranges']['mode']} x{d['ranges']['num_partitions']}" + (
            f" in {d['waves']} waves of <= {d['max_parallel_queries']}" if d.get("waves") else "")
    if plan.staged_path:  # a failed run keeps its copy for inspection
        shutil.rmtree(plan.staged_path, ignore_errors=True)
