"""Arrival polling for sensors: what is new since the cursor, batched into runs.

Local landing zones use the modification time as the cursor: a tick lists the directory and
keeps files newer than the cursor (or at the cursor time but not yet seen). S3 prefixes use the
last key listed as the cursor (`lakehouse.ingest.s3.poll_s3`): see that module for out-of-order keys.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from lakehouse.ingest.files import FileRef, landing_root, list_local_files
from lakehouse.metadata.model import MetadataCatalog
from lakehouse.runner import Platform


@dataclass
class ArrivalBatch:
    files: list[FileRef]

    @property
    def run_key(self) -> str:
        h = hashlib.sha256("|".join(f"{f.key}@{f.etag}" for f in self.files).encode()).hexdigest()[:24]
        return f"arrivals-{h}"


@dataclass
class ArrivalDecision:
    batches: list[ArrivalBatch] = field(default_factory=list)
    cursor: str | None = None
    skip_reason: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


def make_batches(files: list[FileRef], max_files: int, max_bytes: int) -> list[ArrivalBatch]:
    """Group new files into runs of at most max_files files / max_bytes bytes (at least one file each)."""
    out, cur, size = [], [], 0
    for f in files:
        if cur and (len(cur) >= max_files or size + f.size > max_bytes):
            out.append(ArrivalBatch(cur))
            cur, size = [], 0
        cur.append(f)
        size += f.size
    if cur:
        out.append(ArrivalBatch(cur))
    return out


def poll_arrivals(platform: Platform, pipeline_id: str, stage_name: str, cursor: str | None,
                  catalog: MetadataCatalog | None = None) -> ArrivalDecision:
    """`catalog`: the metadata as loaded once for a tick over many sources (default: load it now)."""
    from lakehouse.control.flags import stage_enabled

    catalog = catalog or platform.catalog()
    ok, reason = stage_enabled(platform.store, catalog, pipeline_id, stage_name)  # + source / target flags
    if not ok:
        return ArrivalDecision(skip_reason=reason, cursor=cursor)
    stage = catalog.stage(pipeline_id, stage_name)
    source = catalog.source(stage.source_id)
    return poll_source(platform, source, cursor, catalog.target(stage.target_id).identifier)


def poll_source(platform: Platform, source, cursor: str | None, identifier: str | None) -> ArrivalDecision:
    """New files of one source since the cursor: S3 by key cursor, a landing directory by mtime."""
    if source.kind == "s3":
        from lakehouse.ingest.s3 import poll_s3

        return poll_s3(platform, source, cursor, identifier)
    state = json.loads(cursor) if cursor else {"mtime_ns": 0, "seen": []}
    root = landing_root(source, platform.settings.landing_dir)
    files = list_local_files(source, platform.settings.landing_dir)
    # a refused symlink (status quarantined) may dangle: its own mtime, not its target's
    stamped = [(((root / f.key).stat() if f.local_path else (root / f.key).lstat()).st_mtime_ns, f) for f in files]
    seen = set(state["seen"])
    new = [(m, f) for m, f in stamped if m > state["mtime_ns"] or (m == state["mtime_ns"] and f"{f.key}@{f.etag}" not in seen)]
    if not new:
        return ArrivalDecision(skip_reason=f"no new files in {root}", cursor=cursor)
    top = max(m for m, _ in new)
    new_cursor = json.dumps({"mtime_ns": top, "seen": sorted(f"{f.key}@{f.etag}" for m, f in stamped if m == top)})
    batches = make_batches([f for _, f in sorted(new, key=lambda x: (x[0], x[1].key))], source.max_files_per_run,
                           source.max_bytes_per_run)
    from lakehouse.ingest.s3 import record_requests  # the run reads exactly its batch

    record_requests(platform, source.source_id, identifier, batches, time.time())
    return ArrivalDecision(batches=batches, cursor=new_cursor)
