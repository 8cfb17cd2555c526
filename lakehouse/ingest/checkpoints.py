"""File checkpoints: which landing files are already in a table, committed atomically with the data.

The source of truth is the Iceberg snapshot summary property `lakehouse.files` written by the
same commit that adds the rows, so a crash can never record a file without its rows or the
reverse. Only snapshots in main's ancestry count: an unpublished audit branch is not "processed".
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from lakehouse.iceberg import MAIN, IcebergTables
from lakehouse.ingest.files import CHECKPOINT_PROPERTY, FileRef, read_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse.metadata.model import Source
    from lakehouse.runner import Platform, StageOutcome, StageRunner


def processed_files(platform: Platform, tables: IcebergTables, identifier: str) -> set[tuple[str, str]]:
    main = tables.snapshot_id(identifier, MAIN)
    if main is None:
        return set()
    rows = tables.spark.sql(
        f"SELECT snapshot_id, parent_id, summary[{_lit(CHECKPOINT_PROPERTY)}] AS files "
        f"FROM {tables.metadata_table(identifier, 'snapshots')}"
    ).collect()
    parent = {r["snapshot_id"]: r["parent_id"] for r in rows}
    files = {r["snapshot_id"]: r["files"] for r in rows}
    done: set[tuple[str, str]] = set()
    cur = main
    while cur is not None and cur in parent:
        if files.get(cur):
            done.update((f["key"], f["etag"]) for f in json.loads(files[cur]))
        cur = parent[cur]
    return done


def _lit(value: str) -> str:
    from lakehouse.iceberg import sql_string

    return sql_string(value)


def read_batch(runner: StageRunner, spark: SparkSession, source: Source, chunk: list[FileRef]
               ) -> tuple[DataFrame | None, list[FileRef], list[FileRef]]:
    """(frame over the readable files, readable files, unreadable files)."""
    from pyspark.sql import functions as F

    good = [f for f in chunk if f.size > 0 or source.format != "parquet"]
    empty = [f for f in chunk if f not in good]
    if not good:
        return None, empty, []
    df = read_files(spark, source, good)
    df = df.withColumn("_source_file", F.input_file_name()).withColumn(
        "_ingested_at", F.current_timestamp()
    )
    return df, good + empty, []


def record_published(runner: StageRunner, outcome: StageOutcome) -> None:
    """Hook after publish (the checkpoint itself is already in the snapshot summary)."""
    return None
