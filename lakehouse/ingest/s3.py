"""S3 sources: incremental listing, arrival polling, parallel download to staging, run planning.

Listing cost follows what is new, not what exists. S3 lists keys in lexicographic order, so a
cursor holding the last key seen lets `list_objects_v2(StartAfter=...)` return only keys after
it, page by page (1,000 keys a page). Keys that arrive *out of order* (a key sorting before the
cursor, or an existing key rewritten with a new ETag) are not seen by that; a full
reconciliation listing runs every `options.reconcile_seconds` (default 3600) and picks up any
key+etag that is neither checkpointed nor recently requested. Producers that write dated,
monotonically increasing keys (`.../dt=2026-11-22/hh=03/part-<ts>.parquet`) never need it.

Spark here cannot read `s3a://`, so `read_mode: stage` (the default) downloads the planned
objects with a thread pool into the staging directory and Spark reads the local copies;
`read_mode: direct` hands `s3a://bucket/key` paths to Spark for clusters with hadoop-aws.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from lakehouse.control import faults
from lakehouse.ingest import dated
from lakehouse.ingest.arrivals import (  # noqa: F401 - requested_files: the arrival batch a run reads
    ArrivalDecision,
    make_batches,
    recently_requested,
    record_requests,
    requested_files,
)
from lakehouse.ingest.checkpoints import Checkpoints, engine_for
from lakehouse.ingest.files import QUARANTINED, FileRef, select_for_run
from lakehouse.ingest.paths import key_problem
from lakehouse.metadata.schema import ingest_cursors
from lakehouse.runtime.coordination import claim_new_files, keep_claims

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform
    from lakehouse.stage.core import ExtractPlan, StageContext, StageOutcome

log = logging.getLogger(__name__)

ARRIVAL_TAG = "lakehouse/arrival_batch"
DEFAULT_RECONCILE_SECONDS = 3600.0


# --------------------------------------------------------------------------- client and listing


def client_for(platform: Platform, source: Source, **kw: Any):
    """The platform's S3 client for this source (lakehouse.runtime.s3access: dagster-aws's S3Resource,
    one client per endpoint shared by threads)."""
    return platform.s3.for_source(source, **kw)


def key_matches(key: str, source: Source) -> bool:
    if key.endswith("/"):
        return False
    rel = key[len(source.prefix):].lstrip("/") if key.startswith(source.prefix) else key
    name = rel.rsplit("/", 1)[-1]
    if name.startswith((".", "_")):  # _SUCCESS markers, hidden files
        return False
    return fnmatch(rel, source.glob) or fnmatch(name, source.glob)


def list_files(client, source: Source, start_after: str | None = None, prefix: str | None = None,
               ) -> tuple[list[FileRef], str | None, int]:
    """(matching files after `start_after`, the last key listed, keys listed); every page is read.
    `prefix`: a narrower prefix than the source's (one day of a dated layout)."""
    kwargs: dict[str, Any] = {"Bucket": source.bucket, "Prefix": source.prefix if prefix is None else prefix}
    if start_after:
        kwargs["StartAfter"] = start_after
    out: list[FileRef] = []
    last, listed = None, 0
    for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
        for obj in page.get("Contents", []):
            listed += 1
            last = obj["Key"]
            if key_matches(last, source):
                out.append(FileRef(last, int(obj["Size"]), obj["ETag"].strip('"')))
    return out, last, listed


def _max_key(*keys: str | None) -> str | None:
    present = [k for k in keys if k]
    return max(present) if present else None


def reconcile_seconds(source: Source) -> float:
    return float(source.options.get("reconcile_seconds", DEFAULT_RECONCILE_SECONDS))


# --------------------------------------------------------------------------- sensor side


def poll_s3(platform: Platform, source: Source, cursor: str | None, identifier: str | None = None,
            now: float | None = None) -> ArrivalDecision:
    """One sensor tick: list after the cursor (or reconcile fully when due), batch the new files.

    Uses the checkpoint table only (no Spark): a file already handled is never requested again;
    a file of a batch requested within the reconcile interval is not re-requested.
    """
    now = time.time() if now is None else now
    state = json.loads(cursor) if cursor else {}
    after = state.get("after")
    full = after is None or now - float(state.get("reconciled_at", 0)) >= reconcile_seconds(source)
    client = client_for(platform, source)
    files, last, listed = list_files(client, source, None if full else after)
    new_state = {"after": _max_key(after, last), "reconciled_at": now if full else state.get("reconciled_at", 0)}
    if files and identifier:
        done = Checkpoints(platform, identifier).handled(files)
        files = [f for f in files if (f.key, f.etag) not in done]
    if files and full:
        recent = recently_requested(platform, source.source_id, now - reconcile_seconds(source))
        files = [f for f in files if (f.key, f.etag) not in recent]
    where = f"s3://{source.bucket}/{source.prefix}"
    if not files:
        return ArrivalDecision(cursor=json.dumps(new_state),
                               skip_reason=f"no new files in {where} ({listed} key(s) listed"
                               + (", full reconciliation)" if full else f" after {after!r})"))
    batches = make_batches(files, source.max_files_per_run, source.max_bytes_per_run)
    record_requests(platform, source.source_id, identifier, batches, now)
    return ArrivalDecision(batches=batches, cursor=json.dumps(new_state),
                           tags={"lakehouse/listing": "full" if full else "incremental",
                                 "lakehouse/keys_listed": str(listed)})


# --------------------------------------------------------------------------- run side


def get_cursor(platform: Platform, identifier: str, source_id: str) -> tuple[str | None, float]:
    t = ingest_cursors
    with engine_for(platform).connect() as conn:
        row = conn.execute(sa.select(t.c.after_key, t.c.reconciled_at).where(
            t.c.table_ident == identifier, t.c.source_id == source_id)).first()
    return (row[0], float(row[1] or 0)) if row else (None, 0.0)


def set_cursor(platform: Platform, identifier: str, source_id: str, after: str | None, reconciled_at: float) -> None:
    t = ingest_cursors
    with engine_for(platform).begin() as conn:
        conn.execute(sa.delete(t).where(t.c.table_ident == identifier, t.c.source_id == source_id))
        conn.execute(sa.insert(t).values(table_ident=identifier, source_id=source_id, after_key=after,
                                         reconciled_at=reconciled_at, updated_at=sa.func.now()))


def plan(runner: StageContext, src: Source, plan: ExtractPlan) -> None:
    """Decide this run's files and stage them locally (the s3 source adapter's plan)."""
    platform = runner.platform
    ident = runner.target.identifier
    tables = platform.tables()
    cp = Checkpoints(platform, ident)
    if tables.exists(ident):
        cp.sync(tables)  # only snapshots newer than the checkpoint table's mark
    client = client_for(platform, src)
    batch_key = runner.run_tags.get(ARRIVAL_TAG)
    now = time.time()
    after, reconciled_at = get_cursor(platform, ident, src.source_id)
    day = dated.requested_day(src, runner.run_tags)
    if day is not None:  # one day's prefix, listed in full; the listing cursor is neither read nor moved
        listed_files, last, listed = list_files(client, src, prefix=dated.s3_day_prefix(src, day))
        listing = "dated"
    elif batch_key:
        listed_files, last, listed = requested_files(platform, batch_key), None, 0
        listing = "arrival_batch"
        if not listed_files:
            raise ValueError(f"run tag {ARRIVAL_TAG}={batch_key!r} names no requested files "
                             f"(table arrival_requests); was the control DB reset?")
    else:
        full = after is None or now - reconciled_at >= reconcile_seconds(src)
        listing = "full" if full else "incremental"
        listed_files, last, listed = list_files(client, src, None if full else after)
    done = cp.handled(listed_files)
    new = [f for f in listed_files if (f.key, f.etag) not in done]
    mine, taken = claim_new_files(runner, new)  # files other live runs are loading stay theirs
    picked = keep_claims(runner, select_for_run(mine, src), mine)
    plan.details = {"listing": listing, "keys_listed": listed, "files_found": len(listed_files),
                    "files_new": len(new), "files_planned": len(picked), "start_after": after
                    if listing == "incremental" else None}
    if taken:
        plan.details["files_claimed_by_other_runs"] = taken
    if listing not in ("arrival_batch", "dated"):
        # every listed key up to the cursor below is handled once this run publishes
        complete = len(picked) == len(new)
        hwm = _max_key(after, last) if complete else _max_key(after, _handled_prefix_end(new, picked))
        plan.details["cursor_after_publish"] = {
            "after": hwm, "reconciled_at": now if (listing == "full" and complete) else reconciled_at}
        if not picked:
            set_cursor(platform, ident, src.source_id, hwm, plan.details["cursor_after_publish"]["reconciled_at"])
    if batch_key:
        plan.details["arrival_batch"] = batch_key
    if not picked:
        plan.skipped_reason = (f"no new files in s3://{src.bucket}/{src.prefix}"
                               + (f" that no other run is loading ({taken})" if taken else ""))
        return
    # a key with a '..' segment (or outside the prefix) is never read: it is recorded as refused
    refused = [f.with_status(QUARANTINED, why) for f in picked if (why := key_problem(f.key, src.prefix))]
    picked = [f for f in picked if not key_problem(f.key, src.prefix)]
    plan.details["files_refused"] = len(refused)
    if src.read_mode == "direct":
        plan.files = [FileRef(f.key, f.size, f.etag, f"s3a://{src.bucket}/{f.key}") for f in picked] + refused
        return
    sweep_staging(platform.settings.staging_dir / "s3")
    dest = platform.settings.staging_dir / "s3" / re.sub(r"[^A-Za-z0-9_.-]", "_", runner.run_id)
    t0 = time.monotonic()
    clients = platform.s3.for_threads(platform.s3.endpoint_for(src), src.download_threads)
    staged, skipped = download(clients, src, picked, dest, src.download_threads)
    plan.staged_path = str(dest)
    plan.files = staged + refused
    plan.details.update({"files_downloaded": len(staged), "download_seconds": round(time.monotonic() - t0, 3),
                         "staged_bytes": sum(f.size for f in staged), "files_changed_during_run": len(skipped)})
    for f, why in skipped:
        runner.audit("file_skipped", outcome="retry_later", message=f"{f.key}: {why}",
                     details={"key": f.key, "etag": f.etag})
    if not plan.files:
        plan.skipped_reason = "every planned object changed or vanished during download"


def _handled_prefix_end(new: list[FileRef], picked: list[FileRef]) -> str | None:
    """The last key before the first new key this run does not load (claimed by another run,
    or over the per-run cap): the cursor may move up to it, never past an unloaded key."""
    chosen = {f.key for f in picked}
    end = None
    for key in sorted({f.key for f in new}):
        if key not in chosen:
            break
        end = key
    return end


def sweep_staging(root: Path, max_age_s: float = 86400.0) -> None:
    """Drop staging directories left by killed runs (a finished run removes its own)."""
    if not root.exists():
        return
    cutoff = time.time() - max_age_s
    for d in root.iterdir():
        try:
            if d.is_dir() and d.stat().st_mtime < cutoff:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


def _staged_name(i: int, key: str) -> str:
    ext = "".join(Path(key).suffixes[-2:])
    ext = ext if re.fullmatch(r"[A-Za-z0-9.]{0,16}", ext) else ""
    return f"{i:06d}_{hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:16]}{ext}"


def download(clients, source: Source, files: list[FileRef], dest: Path, threads: int
             ) -> tuple[list[FileRef], list[tuple[FileRef, str]]]:
    """Fetch objects in parallel (ThreadPoolExecutor) into `dest`, pinned to the listed ETag.

    `clients`: one client or several (lakehouse.runtime.s3access.S3Clients.for_threads); worker i uses
    client i % len, so no client's connection pool serves more threads than it holds.

    An object rewritten or deleted since it was listed is skipped (its new version is picked up
    by a later run); any other error fails the run naming the key, so nothing is marked done.
    """
    from botocore.exceptions import ClientError

    dest.mkdir(parents=True, exist_ok=True)
    pool = clients if isinstance(clients, list) else [clients]

    def one(item: tuple[int, FileRef]) -> tuple[FileRef, str | None]:
        i, f = item
        path = dest / _staged_name(i, f.key)
        try:
            resp = pool[i % len(pool)].get_object(Bucket=source.bucket, Key=f.key, IfMatch=f'"{f.etag}"')
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "NoSuchKey", "412", "404"):
                return f, f"changed or deleted since listing ({code})"
            raise RuntimeError(f"downloading s3://{source.bucket}/{f.key} failed: {code or exc}") from exc
        tmp = path.with_name(path.name + ".part")
        with tmp.open("wb") as fh:
            for chunk in resp["Body"].iter_chunks(1 << 20):
                fh.write(chunk)
        tmp.replace(path)
        if i == 0:
            faults.inject("download")
        return FileRef(f.key, f.size, f.etag, str(path)), None

    staged, skipped = [], []
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="s3-download") as workers:
        for ref, why in workers.map(one, enumerate(files)):
            if why is None:
                staged.append(ref)
            else:
                skipped.append((ref, why))
    return staged, skipped


def after_publish(runner: StageContext, outcome: StageOutcome, plan: ExtractPlan) -> None:
    """Advance the listing cursor and drop the staged copies (the data is in Iceberg now)."""
    cur = plan.details.get("cursor_after_publish")
    if cur:
        set_cursor(runner.platform, runner.target.identifier, plan.source_id or runner.stage.source_id,
                   cur["after"], cur["reconciled_at"])
    for k in ("keys_listed", "files_planned", "files_downloaded", "download_seconds", "listing"):
        if k in plan.details:
            outcome.extra[f"s3_{k}"] = plan.details[k]
    if plan.staged_path:
        shutil.rmtree(plan.staged_path, ignore_errors=True)
