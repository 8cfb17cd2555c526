"""Files in a landing zone (local directory or S3 prefix): discovery, checkpoints, reading with Spark."""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.metadata.model import Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CHECKPOINT_PROPERTY = "lakehouse.files"


@dataclass(frozen=True)
class FileRef:
    key: str  # path relative to the landing root, or the S3 key
    size: int
    etag: str
    local_path: str | None = None  # where Spark reads it (staged copy or the landing file itself)

    def as_checkpoint(self) -> dict:
        return {"key": self.key, "etag": self.etag, "size": self.size}


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
        df = reader.option("header", str(source.csv_header).lower()).option("mode", "FAILFAST").csv(paths)
    elif source.format == "jsonl":
        df = reader.option("mode", "FAILFAST").json(paths)
    else:  # pragma: no cover - the model rejects other formats
        raise ValueError(f"unsupported format {source.format}")
    for pf in source.promote_fields:
        df = df.withColumn(pf.column, F.col(pf.path))
    return df


def file_refs_to_json(files: list[FileRef]) -> list[dict]:
    return [asdict(f) for f in files]
