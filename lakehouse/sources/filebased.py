"""What file sources (a landing directory, an S3 prefix) share: checkpointed batches of files,
the exactly-once remainder, unreadable files set aside, and the per-file readability probe."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.ingest import files as file_ingest
from lakehouse.ingest.checkpoints import note_unread_files, read_batch, record_published, spark_frame
from lakehouse.ingest.files import PROCESSED, QUARANTINED, FileRef
from lakehouse.ingest.paths import PathEscape, confine
from lakehouse.ingest.prepare import PreparedFiles, prepare_files, read_alone
from lakehouse.sources.base import SourceAdapter
from lakehouse.stage.core import Batch, ExtractPlan, StageContext, StageOutcome

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse.metadata.model import Source
    from lakehouse.table.publish import PublishResult


@dataclass(frozen=True)
class SparkFilesReader:
    """Spark's `lakehouse.stage.core.FileReader` of prepared files: what lakehouse.engines.isolate reads
    again, some files at a time, when a batch's write fails reading one of them."""

    spark: SparkSession
    source: Source
    prepared: PreparedFiles
    object_uri: Callable[[FileRef], str] | None = None

    def frame(self, files: list[FileRef]) -> DataFrame:
        return spark_frame(self.spark, self.source, files, self.prepared, self.object_uri)

    def check(self, files: list[FileRef]) -> None:
        """Every value of `files` read and dropped (Spark's `noop` sink: no count that a parquet
        footer could answer without reading a page)."""
        self.frame(files).write.format("noop").mode("overwrite").save()


class FileSourceAdapter(SourceAdapter):
    plans_against_main = True
    reads_files = True

    def object_uri(self, ctx: StageContext) -> Callable[[FileRef], str] | None:
        """What `_source_file` names for a staged copy (None: the path Spark read)."""
        return None

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        """Every planned file probed and reconciled on its own first, then read in batches of
        `batch_files` (halved by healing's shrink_batch); one checkpointed commit per batch."""
        src = ctx.source
        todo = [f for f in plan.files if f.key not in ctx.healing.quarantined_files
            and f.key not in ctx.healing.skipped_files]
        done = 0  # progress for the run log: files done / total
        # the files are probed before the session is asked for: the probe needs no JVM, so with
        # `lakehouse run`'s warm-up it runs while the JVM is still starting (SparkSchemaIO gets the
        # session from the tables when it needs one: a parquet footer, an existing table)
        prepared = prepare_files(ctx, None, src, todo)
        spark = ctx.platform.spark()
        for chunk in file_ingest.batches(prepared.files, ctx.healing.effective_batch(src.batch_files),
                                      ctx.healing.effective_batch(src.batch_bytes)):
            df, good, bad = read_batch(ctx, spark, src, chunk, prepared, self.object_uri(ctx))
            done += len(chunk)
            props = {file_ingest.CHECKPOINT_PROPERTY: file_ingest.checkpoint_value(good + bad),
                     "lakehouse.run_id": ctx.run_id}
            if df is not None:
                good = [f for f in good if f.status == PROCESSED]
                yield Batch(df, props, good, label=f"{len(good)} files, {done}/{len(todo)} files done",
                            reader=SparkFilesReader(spark, src, prepared, self.object_uri(ctx)))

    def after_publish(self, ctx: StageContext, plan: ExtractPlan, outcome: StageOutcome) -> None:
        record_published(ctx, outcome)

    def remainder(self, plan: ExtractPlan, result: PublishResult) -> ExtractPlan | None:
        """The planned files no other run published."""
        overlap = result.overlap
        taken = set().union(*overlap.files.values()) if overlap is not None and overlap.files else set()
        left = [f for f in plan.files if (f.key, f.etag) not in taken]
        return dataclasses.replace(plan, files=left) if left else None

    def file_readable(self, ctx: StageContext, f: FileRef) -> bool:
        """Read one file fully with the source's reader, with its own schema."""
        source = ctx.source
        path = Path(f.local_path or f.key)
        if not path.exists():
            return False
        if source is not None and source.format == "parquet":
            import pyarrow.parquet as pq

            try:
                pq.read_table(path)
                return True
            except Exception:  # noqa: BLE001 - any failure to read means unreadable
                return False
        try:
            read_alone(ctx.platform.spark(), source, f).count()
            return True
        except Exception:  # noqa: BLE001
            return False

    def quarantine_files(self, ctx: StageContext, files: list[FileRef], reason: str) -> list[str]:
        """Copy each file to <home>/quarantine/files/<pipeline>/<stage>/<key> and record it in the
        checkpoints as quarantined (the next run does not plan it again); the landing zone itself
        is left untouched."""
        note_unread_files(ctx, [f.with_status(QUARANTINED, reason) for f in files])
        dest_root = ctx.platform.settings.home / "quarantine" / "files" / ctx.stage.pipeline_id / ctx.stage.stage_name
        moved = []
        for f in files:
            if f.local_path and Path(f.local_path).exists():
                try:  # the copy stays under dest_root whatever the key says ('..', absolute)
                    dest = confine(dest_root, f.key, "file key")
                except PathEscape:
                    dest = dest_root / "_refused_keys" / re.sub(r"[^A-Za-z0-9_.-]", "_", f.key)[-200:]
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f.local_path, dest)
                moved.append(str(dest))
        return moved
