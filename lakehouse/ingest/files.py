"""Files in a landing zone (local directory or S3 prefix): discovery, checkpoints, reading with Spark."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.ingest.paths import PathEscape, walk_files
from lakehouse.metadata.model import Source
from lakehouse.stage.core import EMPTY, PROCESSED, QUARANTINED, FileRef  # noqa: F401 - the names ingest has always had

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse.stage.core import StageContext

CHECKPOINT_PROPERTY = "lakehouse.files"




def landing_root(source: Source, landing_dir: Path) -> Path:
    """The source's directory: an absolute `path` as given, a relative one inside the landing dir."""
    p = Path(source.path or "")
    if p.is_absolute():
        return p
    if ".." in p.parts:
        raise PathEscape(f"source {source.source_id!r}: path {source.path!r} has a '..' step and would leave "
                         f"the landing directory {landing_dir}")
    return landing_dir / p


def local_etag(path: Path, follow: bool = True) -> str:
    """Size+mtime fingerprint: cheap, and changes when a file is rewritten in place (or, for a
    refused symlink, re-pointed)."""
    st = path.stat() if follow else path.lstat()
    extra = "" if follow else ":" + os.readlink(path)
    return hashlib.md5(f"{st.st_size}:{st.st_mtime_ns}{extra}".encode(), usedforsecurity=False).hexdigest()


def list_local_files(source: Source, landing_dir: Path) -> list[FileRef]:
    """Matching files under the source's root; a symlink leading out of it is listed as refused
    (quarantined with the reason), never read."""
    root = landing_root(source, landing_dir)
    if not root.exists():
        return []
    out = []
    for rel, p, refused in walk_files(root):
        if p.name.startswith((".", "_")):
            continue
        if not fnmatch.fnmatch(rel, source.glob) and not fnmatch.fnmatch(p.name, source.glob):
            continue
        try:
            if refused:
                out.append(FileRef(rel, p.lstat().st_size, local_etag(p, follow=False), None, QUARANTINED, refused))
            else:
                out.append(FileRef(rel, p.stat().st_size, local_etag(p), str(p)))
        except FileNotFoundError:  # gone since the directory was read: not there for this run
            continue
    return out


def gone_or_changed(f: FileRef) -> str | None:
    """Why a planned local file can no longer be read as planned (None: it is still there, unchanged):
    it vanished, or it was rewritten since the plan (another size or mtime: another etag). Such a
    file is not the file's fault: it is left for the next run, which plans what is there then.
    Remote objects are not checked here (the S3 download checks the etag, lakehouse.ingest.s3)."""
    path = f.local_path
    if not path or "://" in path or f.status != PROCESSED:
        return None
    p = Path(path)
    try:
        now = local_etag(p)
    except FileNotFoundError:
        return "the file vanished between the plan and the read"
    except OSError as exc:
        return f"the file cannot be opened any more ({type(exc).__name__}: {exc.strerror or exc})"
    landing_file = p.as_posix() == f.key or p.as_posix().endswith("/" + f.key.lstrip("/"))
    if landing_file and f.etag and now != f.etag:  # a staged copy's etag is its object's, not size+mtime
        return "the file changed between the plan and the read (another size or modification time)"
    return None


def note_deferred_files(runner: StageContext, files: list[FileRef], reasons: dict[str, str]) -> None:
    """Files that vanished or changed between the plan and the read: nothing is recorded for them
    (no checkpoint), so the next run plans whatever is there then; the reason goes to audit_log
    (event file_deferred), the run log and the run's metadata (`deferred_files`)."""
    report = runner.report
    for f in files:
        why = reasons[f.key]
        report.setdefault("deferred_files", []).append({"key": f.key, "reason": why})
        runner.audit("file_deferred", error_class="FileChanged", outcome="deferred", message=f"{f.key}: {why}",
                     details={"key": f.key, "etag": f.etag, "size": f.size})
        runner.log.warning("left %s for the next run: %s", f.key, why)


def batches(files: list[FileRef], batch_files: int, batch_bytes: int | None = None) -> list[list[FileRef]]:
    """Consecutive groups of at most `batch_files` files and `batch_bytes` bytes, one checkpointed
    commit each: bytes, not a file count alone, bound what one commit reads and caches, so a small
    landing of many files is one commit and a large one still commits as it goes (a file larger
    than `batch_bytes` is a batch of its own)."""
    out: list[list[FileRef]] = []
    chunk: list[FileRef] = []
    size = 0
    for f in files:
        if chunk and (len(chunk) >= batch_files or (batch_bytes is not None and size + f.size > batch_bytes)):
            out.append(chunk)
            chunk, size = [], 0
        chunk.append(f)
        size += f.size
    if chunk:
        out.append(chunk)
    return out


def select_for_run(files: list[FileRef], source: Source) -> list[FileRef]:
    """Cap one run at max_files_per_run and max_bytes_per_run (always at least one file)."""
    picked, total = [], 0
    for f in files:
        if picked and (len(picked) >= source.max_files_per_run or total + f.size > source.max_bytes_per_run):
            break
        picked.append(f)
        total += f.size
    return picked


def checkpoint_value(files: list[FileRef]) -> str:
    return json.dumps([f.as_checkpoint() for f in files], separators=(",", ":"))


def read_files(spark: SparkSession, source: Source, files: list[FileRef]) -> DataFrame:
    """Read files with Spark's own schema inference (`read_mode: direct`, where nothing is local to
    probe); local files go through `lakehouse.ingest.prepare` instead, one schema per file."""
    from pyspark.sql import functions as F

    paths = [f.local_path or f.key for f in files]
    reader = spark.read
    if source.columns:
        reader = reader.schema(", ".join(f"`{c.name}` {c.type}" for c in source.columns))
    if source.format == "parquet":
        df = reader.parquet(*paths)
    elif source.format == "csv":
        # multiLine: quoted fields may contain newlines (RFC 4180); the probe accepts them, so must Spark
        df = (reader.option("header", str(source.csv_header).lower()).option("mode", "FAILFAST")
              .option("multiLine", source.options.get("csv_multiline", "true")).csv(paths))
    elif source.format == "jsonl":
        df = reader.option("mode", "FAILFAST").json(paths)
    else:  # pragma: no cover - the model rejects other formats
        raise ValueError(f"unsupported format {source.format}")
    for pf in source.promote_fields:
        df = df.withColumn(pf.column, F.col(pf.path))
    return df


def file_refs_to_json(files: list[FileRef]) -> list[dict]:
    return [asdict(f) for f in files]
