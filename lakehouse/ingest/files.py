"""Files in a landing zone (local directory or S3 prefix): discovery, checkpoints, reading with Spark."""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.metadata.model import Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHECKPOINT_PROPERTY = "lakehouse.files"


#: checkpoint statuses: rows committed / zero bytes (nothing to read) / unreadable, kept out of the table
PROCESSED, EMPTY, QUARANTINED = "processed", "empty", "quarantined"


@dataclass(frozen=True)
class FileRef:
    key: str  # path relative to the landing root, or the S3 key
    size: int
    etag: str
    local_path: str | None = None  # where Spark reads it (staged copy or the landing file itself)
    status: str = PROCESSED
    error: str | None = None

    def as_checkpoint(self) -> dict:
        d = {"key": self.key, "etag": self.etag, "size": self.size}
        if self.status != PROCESSED:
            d["status"] = self.status
        if self.error:
            d["error"] = self.error[:500]
        return d

    def with_status(self, status: str, error: str | None = None) -> FileRef:
        return replace(self, status=status, error=error)


def landing_root(source: Source, landing_dir: Path) -> Path:
    p = Path(source.path or "")
    return p if p.is_absolute() else landing_dir / p


def local_etag(path: Path) -> str:
    """Size+mtime fingerprint: cheap, and changes when a file is rewritten in place."""
    st = path.stat()
    return hashlib.md5(f"{st.st_size}:{st.st_mtime_ns}".encode(), usedforsecurity=False).hexdigest()


def list_local_files(source: Source, landing_dir: Path) -> list[FileRef]:
    root = landing_root(source, landing_dir)
    if not root.exists():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name.startswith((".", "_")):
            continue
        rel = p.relative_to(root).as_posix()
        if not fnmatch.fnmatch(rel, source.glob) and not fnmatch.fnmatch(p.name, source.glob):
            continue
        out.append(FileRef(rel, p.stat().st_size, local_etag(p), str(p)))
    return out


def batches(files: list[FileRef], batch_files: int) -> list[list[FileRef]]:
    return [files[i : i + batch_files] for i in range(0, len(files), batch_files)]


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
    """Read a batch with Spark in the source's format and expected schema, then promote nested fields."""
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


#: JSON / CSV files up to this size are parsed completely by the probe; larger ones head and tail.
PROBE_FULL_BYTES = 256 * 1024**2


def probe_file(path: str, fmt: str, csv_header: bool = True) -> str | None:
    """A cheap local check that Spark can read the file: None if fine, else the reason.

    Parquet: the footer (pyarrow reads only the metadata). JSON lines: every line parses (head
    and tail for very large files). CSV: UTF-8 and one field count throughout. A bad file found
    here is quarantined alone instead of failing the whole batch inside Spark.
    """
    p = Path(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            md = pq.read_metadata(p)
            if md.num_columns == 0:
                return "parquet file has no columns"
            return None
        size = p.stat().st_size
        with p.open("rb") as fh:
            if size <= PROBE_FULL_BYTES:
                data = fh.read()
            else:  # head and tail, cut at line boundaries
                head = fh.read(8 * 1024**2)
                fh.seek(max(0, size - 8 * 1024**2))
                tail = fh.read()
                data = head[: head.rfind(b"\n") + 1] + tail[tail.find(b"\n") + 1 :]
        if fmt == "jsonl":
            for n, raw in enumerate(data.split(b"\n"), 1):
                if raw.strip():
                    try:
                        obj = json.loads(raw)
                    except (ValueError, UnicodeDecodeError) as exc:
                        return f"line {n}: not valid JSON ({exc})"
                    if not isinstance(obj, dict):
                        return f"line {n}: a JSON {type(obj).__name__}, not an object"
            return None
        if fmt == "csv":
            import csv
            import io

            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"not UTF-8 text ({exc})"
            width = None
            for n, row in enumerate(csv.reader(io.StringIO(text, newline="")), 1):
                if not row:
                    continue
                if width is None:
                    width = len(row)
                elif len(row) != width:
                    return f"row {n} has {len(row)} fields, expected {width} (truncated or malformed)"
            return None
    except Exception as exc:  # noqa: BLE001 - any reader error means "unreadable"
        return f"{type(exc).__name__}: {exc}"
    return None
