"""File checkpoints: which landing files are already in a table, committed atomically with the data.

The source of truth is the Iceberg snapshot summary property `lakehouse.files` written by the
same commit that adds the rows, so a crash can never record a file without its rows or the
reverse. Only snapshots in main's ancestry count: an unpublished audit branch is not "processed".

The control DB table `file_checkpoints` mirrors those summaries so that the question "was this
file processed?" is an indexed lookup instead of a walk over every snapshot summary. It carries a
high-water mark (`checkpoint_marks`: the main snapshot it reflects); each run folds in only the
snapshots committed after the mark, so a crash between publish and the table write loses nothing:
the next run finds the newer snapshot and folds it in. Files that produce no rows (empty ones,
quarantined ones) are written to the table directly, since they have no data to be atomic with.
`rebuild` re-derives the table from the summaries (e.g. after a rollback of main).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from lakehouse.control import faults
from lakehouse.ingest.files import (
    CHECKPOINT_PROPERTY,
    PROCESSED,
    QUARANTINED,
    FileRef,
    gone_or_changed,
    note_deferred_files,
)
from lakehouse.metadata.schema import checkpoint_marks, file_checkpoints
from lakehouse.table.iceberg import MAIN, IcebergTables, sql_string

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse.ingest.prepare import PreparedFiles
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform
    from lakehouse.stage.core import StageContext, StageOutcome

log = logging.getLogger(__name__)
RUN_ID_PROPERTY = "lakehouse.run_id"



def engine_for(platform: Platform) -> sa.Engine:
    """The control DB engine with the ingestion tables created."""
    return _engine(platform)


def _engine(platform: Platform) -> sa.Engine:
    from lakehouse.metadata.store import ensure_tables

    return ensure_tables(platform.store.engine)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class CheckpointRow:
    key: str
    etag: str
    size: int
    status: str
    run_id: str | None
    snapshot_id: int | None
    error: str | None = None


class Checkpoints:
    """The checkpoint table of one Iceberg table (identifier `namespace.table`)."""

    def __init__(self, platform: Platform, identifier: str):
        self.platform = platform
        self.identifier = identifier
        self.engine = _engine(platform)

    # ------------------------------------------------------------------ writes
    def record(self, rows: Iterable[CheckpointRow]) -> int:
        """Insert-or-replace rows by (table, key, etag); one transaction."""
        rows = list(rows)
        if not rows:
            return 0
        t = file_checkpoints
        now = _now()
        with self.engine.begin() as conn:
            for chunk in _chunks(rows, 400):
                conds = [sa.and_(t.c.file_key == r.key, t.c.etag == r.etag) for r in chunk]
                conn.execute(sa.delete(t).where(t.c.table_ident == self.identifier, sa.or_(*conds)))
                conn.execute(sa.insert(t), [
                    {"table_ident": self.identifier, "file_key": r.key, "etag": r.etag, "size": r.size,
                     "status": r.status, "run_id": r.run_id, "snapshot_id": r.snapshot_id,
                     "error": (r.error or None) and r.error[:4000], "recorded_at": now}
                    for r in chunk
                ])
        return len(rows)

    def record_files(self, files: Iterable[FileRef], run_id: str, snapshot_id: int | None = None) -> int:
        return self.record(CheckpointRow(f.key, f.etag, f.size, f.status, run_id, snapshot_id, f.error) for f in files)

    def mark(self) -> tuple[int | None, int | None]:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(checkpoint_marks.c.snapshot_id, checkpoint_marks.c.committed_at_ms).where(
                    checkpoint_marks.c.table_ident == self.identifier)
            ).first()
        return (row[0], row[1]) if row else (None, None)

    def _set_mark(self, conn: sa.Connection, snapshot_id: int | None, committed_at_ms: int | None) -> None:
        conn.execute(sa.delete(checkpoint_marks).where(checkpoint_marks.c.table_ident == self.identifier))
        conn.execute(sa.insert(checkpoint_marks).values(table_ident=self.identifier, snapshot_id=snapshot_id,
                                                        committed_at_ms=committed_at_ms, synced_at=_now()))

    # ------------------------------------------------------------------ sync from Iceberg
    def sync(self, tables: IcebergTables, *, full: bool = False) -> int:
        """Fold the summaries of main's snapshots newer than the mark into the table. Returns files added."""
        if not tables.exists(self.identifier):
            return 0
        main = tables.snapshot_id(self.identifier, MAIN)
        mark, mark_ms = (None, None) if full else self.mark()
        if main is None or main == mark:
            return 0
        rows = _snapshot_rows(tables, self.identifier, mark_ms)
        chain, reached = _walk(rows, main, stop=mark)
        if mark is not None and not reached:
            # the mark is not an ancestor of main any more (rollback, expiry): fold in everything
            rows = _snapshot_rows(tables, self.identifier, None)
            chain, _ = _walk(rows, main, stop=None)
        out: list[CheckpointRow] = []
        for r in reversed(chain):  # oldest first, so a re-commit of a key later wins
            if not r["files"]:
                continue
            for f in json.loads(r["files"]):
                out.append(CheckpointRow(f["key"], f["etag"], int(f.get("size", 0)), f.get("status", PROCESSED),
                                         r["run_id"], r["snapshot_id"], f.get("error")))
        self.record(out)
        with self.engine.begin() as conn:
            self._set_mark(conn, main, rows[main]["ms"] if main in rows else None)
        if out:
            log.info("%s: folded %d file checkpoint(s) from %d snapshot(s) into the checkpoint table",
                     self.identifier, len(out), len(chain))
        return len(out)

    def rebuild(self, tables: IcebergTables) -> int:
        """Drop this table's checkpoint rows and re-derive them from main's snapshot summaries.

        Rows for files that never committed data (quarantined, empty) survive, since no summary
        may carry them.
        """
        with self.engine.begin() as conn:
            conn.execute(sa.delete(file_checkpoints).where(file_checkpoints.c.table_ident == self.identifier,
                                                           file_checkpoints.c.status == PROCESSED))
            conn.execute(sa.delete(checkpoint_marks).where(checkpoint_marks.c.table_ident == self.identifier))
        return self.sync(tables, full=True)

    # ------------------------------------------------------------------ reads
    def handled(self, files: Iterable[FileRef]) -> set[tuple[str, str]]:
        """(key, etag) among `files` that are already processed, empty or quarantined: an indexed lookup."""
        files = list(files)
        t = file_checkpoints
        out: set[tuple[str, str]] = set()
        with self.engine.connect() as conn:
            for chunk in _chunks(sorted({f.key for f in files}), 500):
                for k, e in conn.execute(sa.select(t.c.file_key, t.c.etag).where(
                        t.c.table_ident == self.identifier, t.c.file_key.in_(chunk))):
                    out.add((k, e))
        return out

    def all_handled(self) -> set[tuple[str, str]]:
        t = file_checkpoints
        with self.engine.connect() as conn:
            return {(k, e) for k, e in conn.execute(
                sa.select(t.c.file_key, t.c.etag).where(t.c.table_ident == self.identifier))}

    def rows(self, status: str | None = None, limit: int | None = None) -> list[dict]:
        t = file_checkpoints
        q = sa.select(t).where(t.c.table_ident == self.identifier).order_by(t.c.recorded_at, t.c.file_key)
        if status:
            q = q.where(t.c.status == status)
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(q).mappings()]

    def counts(self) -> dict[str, int]:
        t = file_checkpoints
        with self.engine.connect() as conn:
            return {s: n for s, n in conn.execute(
                sa.select(t.c.status, sa.func.count()).where(t.c.table_ident == self.identifier).group_by(t.c.status))}


def _snapshot_rows(tables: IcebergTables, identifier: str, since_ms: int | None) -> dict[int, dict]:
    """snapshot_id -> {snapshot_id, parent_id, ms, files, run_id} for snapshots committed at/after since_ms."""
    meta = getattr(tables, "meta", None)
    if meta is not None:  # PyIceberg: reads the metadata file, no Spark job
        out = {}
        for sn in meta.load_table(identifier).metadata.snapshots:
            if since_ms is not None and sn.timestamp_ms < since_ms:
                continue
            props = sn.summary.additional_properties if sn.summary is not None else {}
            out[sn.snapshot_id] = {"snapshot_id": sn.snapshot_id, "parent_id": sn.parent_snapshot_id,
                                   "ms": sn.timestamp_ms, "files": props.get(CHECKPOINT_PROPERTY),
                                   "run_id": props.get(RUN_ID_PROPERTY)}
        return out
    q = (f"SELECT snapshot_id, parent_id, CAST(unix_millis(committed_at) AS BIGINT) AS ms, "
         f"summary[{sql_string(CHECKPOINT_PROPERTY)}] AS files, summary[{sql_string(RUN_ID_PROPERTY)}] AS run_id "
         f"FROM {tables.metadata_table(identifier, 'snapshots')}")
    if since_ms is not None:
        q += f" WHERE committed_at >= timestamp_millis({int(since_ms)})"
    return {r["snapshot_id"]: r.asDict() for r in tables.spark.sql(q).collect()}


def _walk(rows: dict, head: int, stop: int | None) -> tuple[list, bool]:
    """Snapshots from `head` back along parent links until `stop`; (chain, stop was reached)."""
    chain, cur = [], head
    while cur is not None and cur in rows and cur != stop:
        chain.append(rows[cur])
        cur = rows[cur]["parent_id"]
    return chain, cur == stop


def _chunks(seq: list, n: int):
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def processed_files(platform: Platform, tables: IcebergTables, identifier: str) -> set[tuple[str, str]]:
    """(key, etag) of every file handled for `identifier` (rows on main, empty, or quarantined)."""
    cp = Checkpoints(platform, identifier)
    cp.sync(tables)
    return cp.all_handled()


# --------------------------------------------------------------------------- reading a batch


def read_batch(runner: StageContext, spark: SparkSession, source: Source, chunk: list[FileRef],
               prepared: PreparedFiles | None = None, object_uri: Callable[[FileRef], str] | None = None,
               ) -> tuple[DataFrame | None, list[FileRef], list[FileRef]]:
    """(frame over the loadable files, every file of the chunk with its status, []).

    `object_uri`: what `_source_file` names for a staged copy (the S3 object), from the adapter.

    Every file was probed and reconciled on its own before (`lakehouse.ingest.prepare`; done here
    for the chunk alone when the caller did not): an empty file is recorded as `empty`, an
    unreadable or unfitting one as `quarantined` (checkpoint table + audit_log), and the rest of
    the batch proceeds.
    """

    from lakehouse.ingest.prepare import prepare_files

    if prepared is None:
        prepared = prepare_files(runner, spark, source, chunk)
        chunk = prepared.files
    checked, good = checked_files(runner, chunk)
    if not good:
        return None, checked, []
    return spark_frame(spark, source, good, prepared, object_uri), checked, []


def spark_frame(spark: SparkSession, source: Source, good: list[FileRef], prepared: PreparedFiles,
                object_uri: Callable[[FileRef], str] | None = None) -> DataFrame:
    """Spark's frame over loadable prepared files, with the lineage columns the source asks for."""
    from pyspark.sql import functions as F

    if not (source.lineage_columns or source.path_columns):
        return prepared.read(spark, good)
    staged = {f.local_path: f for f in good if f.local_path and f.local_path != f.key and "://" not in f.local_path}
    names = None
    if staged and object_uri is not None:
        # staged copies have opaque names: report the object each row came from
        from pathlib import Path

        pairs = []
        for p, f in staged.items():
            pairs += [F.lit(Path(p).resolve().as_uri()), F.lit(object_uri(f))]
        names = F.create_map(*pairs)
    added = [pc.name for pc in source.path_columns] + (["_source_file"] if source.lineage_columns else [])

    def with_source_file(df: DataFrame) -> DataFrame:
        path = source_file_column(df)
        src_file = path if names is None else F.element_at(names, path)
        for pc in source.path_columns:  # Hive-style `name=value` segments of the file's path (lakehouse.ingest.dated)
            from lakehouse.ingest.dated import segment_pattern

            value = F.regexp_extract(src_file, segment_pattern(pc.name), 1)
            df = df.withColumn(pc.name, F.when(value == "", F.lit(None)).otherwise(value).cast(pc.type))
        return df.withColumn("_source_file", src_file) if source.lineage_columns else df

    df = prepared.read(spark, good, each=with_source_file)
    if source.promote_fields:  # promoted columns came after them: keep the table's column order
        from lakehouse.sql.text import quote

        df = df.select(*[F.col(quote(c)) for c in df.columns if c not in added], *[F.col(quote(c)) for c in added])
    if not source.lineage_columns:
        return df
    return df.withColumn("_ingested_at", F.current_timestamp())


def source_file_column(df: DataFrame):
    """The file each row of `df` (a file reader's frame) came from, spelt as `input_file_name()`
    spells it (`file:///...` for a local file) but deterministic: Spark's hidden file metadata column
    `_metadata.file_path` (`file:/...`, otherwise the same encoding). A nondeterministic expression
    such as `input_file_name()` may not reach a MERGE (INVALID_NON_DETERMINISTIC_EXPRESSIONS).
    A file with its own `_metadata` column hides Spark's: `input_file_name()` then."""
    from pyspark.sql import functions as F

    if any(c.lower() == "_metadata" for c in df.columns):
        return F.input_file_name()
    return F.regexp_replace(F.col("_metadata.file_path"), "^file:/+", "file:///")


def checked_files(runner: StageContext, chunk: list[FileRef]) -> tuple[list[FileRef], list[FileRef]]:
    """(every file of a prepared chunk, the loadable ones): the others are recorded now (empty,
    quarantined); whichever engine reads the chunk (Spark here, lakehouse.engines.arrow) calls this."""
    faults.inject("before_batch" if not runner.batches_read else "after_branch_commit", runner)
    runner.batches_read += 1
    gone = {f.key: why for f in chunk if (why := gone_or_changed(f)) is not None}
    if gone:  # vanished or rewritten since the plan: left for the next run, not recorded
        note_deferred_files(runner, [f for f in chunk if f.key in gone], gone)
        runner.healing.skipped_files.update(gone)
    checked = [f for f in chunk if f.key not in gone]
    unread = [f for f in checked if f.status != PROCESSED]
    if unread:
        note_unread_files(runner, unread)
    return checked, [f for f in checked if f.status == PROCESSED]


def note_unread_files(runner: StageContext, files: list[FileRef]) -> None:
    """Record empty / quarantined files now (no rows depend on them) and tell the run's metadata."""
    from lakehouse.ingest.prepare import quarantine_class

    tables_ident = runner.target.identifier
    Checkpoints(runner.platform, tables_ident).record_files(files, runner.run_id)
    report = runner.report
    for f in files:
        if f.status == QUARANTINED:
            report.setdefault("quarantined_files", []).append({"key": f.key, "error": f.error})
            runner.audit("file_quarantined", error_class=quarantine_class(f.error), outcome="quarantined",
                         message=f"{f.key}: {f.error}", details={"key": f.key, "etag": f.etag, "size": f.size})
            runner.log.warning("quarantined unreadable file %s: %s", f.key, f.error)
        else:
            report.setdefault("empty_files", []).append(f.key)


def ingest_metadata(runner: StageContext) -> dict:
    """Materialization metadata about files: how many quarantined / empty, and which."""
    report = runner.report
    md: dict = {}
    q = report.get("quarantined_files") or []
    if q:
        md["quarantined_files"] = len(q)
        md["quarantined_file_errors"] = json.dumps(q[:50])
    if report.get("empty_files"):
        md["empty_files"] = len(report["empty_files"])
    deferred = report.get("deferred_files") or []
    if deferred:  # vanished or changed during the run: the next run reads them as they are then
        md["files_deferred"] = len(deferred)
        md["deferred_file_reasons"] = json.dumps(deferred[:50])
    if report.get("schema_changes"):  # new columns / widenings applied before the write
        md["schema_changes"] = report["schema_changes"]
    if report.get("schema_notes"):  # per loaded file: what it lacked (NULL) or was cast
        md["schema_notes"] = json.dumps(report["schema_notes"][:50])
    for k in ("files_downloaded", "download_seconds", "staged_bytes"):
        if k in report:
            md[k] = report[k]
    return md


def record_published(runner: StageContext, outcome: StageOutcome) -> None:
    """After publish: fold the new main snapshots into the checkpoint table, report the files."""
    faults.inject("after_publish")
    Checkpoints(runner.platform, runner.target.identifier).sync(runner.platform.tables())
    outcome.extra.update(ingest_metadata(runner))
