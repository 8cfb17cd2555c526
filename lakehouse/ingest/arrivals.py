"""Arrival polling for sensors: what is new since the cursor, batched into runs.

The per-source dispatch (`poll_arrivals`, `poll_source`) is `lakehouse.sources.arrivals`; this
module holds the batches and the landing-directory poll the files adapter uses.

Local landing zones use the modification time as the cursor: a tick lists the directory and
keeps files newer than the cursor (or at the cursor time but not yet seen). S3 prefixes use the
last key listed as the cursor (`lakehouse.ingest.s3.poll_s3`): see that module for out-of-order keys.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa

from lakehouse.ingest.checkpoints import engine_for
from lakehouse.ingest.files import FileRef, landing_root, list_local_files
from lakehouse.metadata.schema import arrival_requests

if TYPE_CHECKING:
    from lakehouse.platform import Platform


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


def poll_local(platform: Platform, source, cursor: str | None, identifier: str | None) -> ArrivalDecision:
    """New files of a landing directory since the cursor (modification time, then names seen at it)."""
    state = json.loads(cursor) if cursor else {"mtime_ns": 0, "seen": []}
    root = landing_root(source, platform.settings.landing_dir)
    files = list_local_files(source, platform.settings.landing_dir)
    # a refused symlink (status quarantined) may dangle: its own mtime, not its target's
    stamped = []
    for f in files:
        try:
            stamped.append((((root / f.key).stat() if f.local_path else (root / f.key).lstat()).st_mtime_ns, f))
        except FileNotFoundError:  # gone since it was listed: not an arrival
            continue
    seen = set(state["seen"])
    new = [(m, f) for m, f in stamped if m > state["mtime_ns"] or (m == state["mtime_ns"] and f"{f.key}@{f.etag}" not in seen)]
    if not new:
        return ArrivalDecision(skip_reason=f"no new files in {root}", cursor=cursor)
    top = max(m for m, _ in new)
    new_cursor = json.dumps({"mtime_ns": top, "seen": sorted(f"{f.key}@{f.etag}" for m, f in stamped if m == top)})
    batches = make_batches([f for _, f in sorted(new, key=lambda x: (x[0], x[1].key))], source.max_files_per_run,
                           source.max_bytes_per_run)
    record_requests(platform, source.source_id, identifier, batches, time.time())
    return ArrivalDecision(batches=batches, cursor=new_cursor)


def record_requests(platform: Platform, source_id: str, identifier: str | None, batches, now: float) -> None:
    eng = engine_for(platform)
    with eng.begin() as conn:
        for b in batches:
            conn.execute(sa.delete(arrival_requests).where(arrival_requests.c.batch_key == b.run_key))
            conn.execute(sa.insert(arrival_requests), [
                {"batch_key": b.run_key, "file_key": f.key, "etag": f.etag, "size": f.size,
                 "source_id": source_id, "table_ident": identifier, "requested_at": now} for f in b.files])


def recently_requested(platform: Platform, source_id: str, since: float) -> set[tuple[str, str]]:
    t = arrival_requests
    with engine_for(platform).connect() as conn:
        return {(k, e) for k, e in conn.execute(
            sa.select(t.c.file_key, t.c.etag).where(t.c.source_id == source_id, t.c.requested_at >= since))}


def requested_files(platform: Platform, batch_key: str) -> list[FileRef]:
    t = arrival_requests
    with engine_for(platform).connect() as conn:
        rows = conn.execute(sa.select(t.c.file_key, t.c.etag, t.c.size).where(t.c.batch_key == batch_key)
                            .order_by(t.c.file_key)).all()
    return [FileRef(k, int(s or 0), e) for k, e, s in rows]
