"""The raw_record size cap of entity_raw (seed 000's open question: "cap raw_record to prevent
extremely large JSON blobs?").

A record whose JSON is larger than the application's `max_record_bytes` (UTF-8 bytes) is not
loaded, and never loaded truncated: it goes whole, with its key (tenant, file key and etag, row
index in the file, typename, entity name), its size and the cap, to `entity_raw.<app>__quarantine`.
The quarantine write happens before the load's commit and skips records already there (same
tenant, file, etag and row), so a load retried after a crash quarantines nothing twice.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.table.iceberg import quote, sql_string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.ingest.files import FileRef
    from lakehouse.platform import Platform

log = logging.getLogger(__name__)

SUFFIX = "__quarantine"
#: Row provenance carried next to the raw columns until the cap is applied (then dropped).
FILE_COLUMN = "__lh_source_path__"
ROW_COLUMN = "__lh_row_index__"
PROVENANCE = (FILE_COLUMN, ROW_COLUMN)

QUARANTINE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("typename", "string"), ("connection_qualified_name", "string"), ("workflow_id", "string"),
    ("workflow_run_id", "string"), ("extracted_at", "bigint"), ("tenant_id", "string"), ("entity_name", "string"),
    ("raw_record", "string"), ("file_key", "string"), ("file_etag", "string"), ("row_index", "bigint"),
    ("record_bytes", "bigint"), ("max_record_bytes", "bigint"), ("reason", "string"), ("run_id", "string"),
    ("quarantined_at", "timestamp"),
)
KEY = ("tenant_id", "file_key", "file_etag", "row_index")


def quarantine_identifier(identifier: str) -> str:
    return identifier + SUFFIX


def with_provenance(raw: DataFrame) -> DataFrame:
    """The raw rows plus the file each came from and its row index in that file (Parquet `_metadata`)."""
    from pyspark.sql import functions as F

    clash = [c for c in PROVENANCE if c in raw.columns]
    if clash:
        raise ValueError(f"raw files have column(s) {clash}, names the entity_raw loader reserves")
    return raw.select("*", F.col("_metadata.file_path").alias(FILE_COLUMN),
                      F.col("_metadata.row_index").alias(ROW_COLUMN))


def _norm(path: str) -> str:
    return str(Path(path).resolve())


def apply_cap(platform: Platform, identifier: str, df: DataFrame, files: list[FileRef], max_bytes: int,
              run_id: str) -> tuple[DataFrame, int]:
    """(the rows to load, without provenance; how many oversized records were quarantined).

    `df` should be persisted by the caller: the size check and the load then read the files and
    build the JSON once."""
    from pyspark.sql import functions as F

    spark = platform.spark()
    size = F.octet_length(F.col("raw_record"))
    over = df.where(size > F.lit(int(max_bytes)))
    keep = df.where(size <= F.lit(int(max_bytes))).drop(*PROVENANCE)
    if over.count() == 0:
        return keep, 0
    keys = spark.createDataFrame([(_norm(f.local_path or f.key), f.key, f.etag) for f in files],
                                 "path string, file_key string, file_etag string")
    path = F.expr(f"url_decode(regexp_replace({quote(FILE_COLUMN)}, '^file:(//)?', ''))")
    rows = (over.withColumn("__path", path)
            .join(F.broadcast(keys), F.col("__path") == F.col("path"), "left")
            .select(*[F.col(c) for c, _ in QUARANTINE_COLUMNS[:8]],
                    F.coalesce(F.col("file_key"), F.col(FILE_COLUMN)).alias("file_key"),
                    F.col("file_etag"),
                    F.col(ROW_COLUMN).cast("bigint").alias("row_index"),
                    size.cast("bigint").alias("record_bytes"),
                    F.lit(int(max_bytes)).cast("bigint").alias("max_record_bytes"),
                    F.lit(f"raw_record over max_record_bytes={max_bytes}").alias("reason"),
                    F.lit(run_id).alias("run_id"),
                    F.current_timestamp().alias("quarantined_at")))
    n = write_quarantine(platform, identifier, rows, run_id)
    log.warning("%s: %d record(s) over %d bytes quarantined in %s", identifier, n, max_bytes,
                quarantine_identifier(identifier))
    return keep, n


def write_quarantine(platform: Platform, identifier: str, rows: DataFrame, run_id: str) -> int:
    """Append the oversized records not already quarantined; returns how many are quarantined
    for this load (new or found from an earlier attempt)."""
    tables = platform.tables()
    qident = quarantine_identifier(identifier)
    cols = ", ".join(f"{quote(c)} {t}" for c, t in QUARANTINE_COLUMNS)
    platform.spark().sql(
        f"CREATE TABLE IF NOT EXISTS {tables.qualified(qident)} ({cols}) USING iceberg TBLPROPERTIES ("
        f"{sql_string('format-version')}={sql_string('2')}, {sql_string('comment')}="
        f"{sql_string('entity_raw records over the application max_record_bytes, kept whole with their key')})")
    rows = rows.persist()
    try:
        total = rows.count()
        existing = tables.read(qident).select(*KEY)
        new = rows.join(existing, on=list(KEY), how="left_anti")
        writer = new.writeTo(tables.qualified(qident)).option("snapshot-property.lakehouse.run_id", run_id)
        writer.append()
        return total
    finally:
        rows.unpersist()
