"""An S3 prefix (any S3-compatible endpoint), through the platform's S3 clients (dagster-aws)."""

from __future__ import annotations

import fnmatch
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from lakehouse.ingest import s3 as s3_ingest
from lakehouse.ingest.arrivals import ArrivalDecision
from lakehouse.ingest.checkpoints import record_published
from lakehouse.ingest.files import FileRef
from lakehouse.sources.base import register
from lakehouse.sources.filebased import FileSourceAdapter
from lakehouse.stage.core import ExtractPlan, StageContext, StageOutcome

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform

#: how long a probe waits for the endpoint's answer before calling the source unreachable
PROBE_TIMEOUT_S = 5.0
#: entity_raw loads from a bucket without a source of their own use this many download threads
DEFAULT_THREADS = 8


def _literal_prefix(pattern: str) -> str:
    m = re.search(r"[*?\[]", pattern)
    return pattern if m is None else pattern[: m.start()]


@register
class S3Adapter(FileSourceAdapter):
    kind = "s3"

    def plan(self, ctx: StageContext, src: Source, plan: ExtractPlan) -> None:
        s3_ingest.plan(ctx, src, plan)

    def object_uri(self, ctx: StageContext) -> Callable[[FileRef], str] | None:
        bucket = ctx.source.bucket
        return lambda f: f"s3://{bucket}/{f.key}"  # staged copies have opaque names

    def after_publish(self, ctx: StageContext, plan: ExtractPlan, outcome: StageOutcome) -> None:
        record_published(ctx, outcome)
        s3_ingest.after_publish(ctx, outcome, plan)  # the listing cursor; the staged copies go

    def probe(self, platform: Platform, src: Source, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
        """HEAD the bucket with a single attempt (the resource's own retries would hide an outage),
        answered within `timeout_s`: S3Resource sets no socket timeouts, so an endpoint that accepts
        and never answers would hold the probe for botocore's 60 s; the HEAD is left to finish on a
        daemon thread and the source reported unreachable."""
        done: Future[None] = Future()

        def head() -> None:
            try:
                platform.s3.for_source(src, max_attempts=1).head_bucket(Bucket=src.bucket)
                done.set_result(None)
            except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
                done.set_exception(exc)

        threading.Thread(target=head, name=f"s3-probe-{src.source_id}", daemon=True).start()
        try:
            done.result(timeout=timeout_s)
        except FutureTimeout:
            return False, f"s3://{src.bucket}: no answer from the endpoint within {timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"s3://{src.bucket} reachable"

    def poll(self, platform: Platform, src: Source, cursor: str | None, identifier: str | None) -> ArrivalDecision:
        return s3_ingest.poll_s3(platform, src, cursor, identifier)

    def list_files(self, platform: Platform, src: Source) -> list[FileRef]:
        files, _, _ = s3_ingest.list_files(s3_ingest.client_for(platform, src), src)
        return files

    def find_files(self, platform: Platform, src: Source | None, keys: list[str], patterns: list[str],
                   what: str, bucket: str | None = None) -> tuple[list[FileRef], str]:
        """Objects named by key (HEAD) or matching a pattern (listing from its literal prefix)."""
        from botocore.exceptions import ClientError

        bucket = bucket or (src.bucket if src is not None else None)
        if not bucket:
            raise ValueError(f"{what} names no bucket and the application has no S3 source")
        client = platform.s3.for_source(src)
        found: dict[str, FileRef] = {}
        for k in keys:
            try:
                h = client.head_object(Bucket=bucket, Key=k)
            except ClientError as exc:
                raise FileNotFoundError(f"{what}: s3://{bucket}/{k} not found "
                                        f"({exc.response.get('Error', {}).get('Code')})") from exc
            found[k] = FileRef(k, int(h["ContentLength"]), h["ETag"].strip('"'))
        for pat in patterns:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=_literal_prefix(pat)):
                for obj in page.get("Contents", []):
                    if fnmatch.fnmatchcase(obj["Key"], pat) and not obj["Key"].endswith("/"):
                        found[obj["Key"]] = FileRef(obj["Key"], int(obj["Size"]), obj["ETag"].strip('"'))
        return sorted(found.values(), key=lambda f: f.key), f"s3://{bucket}/"

    def stage_files(self, platform: Platform, src: Source | None, files: list[FileRef], location: str,
                    run_id: str, what: str) -> tuple[list[FileRef], str | None]:
        """Download to <staging>/entity_raw/<run> in parallel, pinned to the listed ETags; an object
        changed since it was found is skipped (logged), its new version comes with a later load."""
        staging = platform.settings.staging_dir / "entity_raw" / re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)
        threads = src.download_threads if src is not None else DEFAULT_THREADS
        bucket = location[len("s3://"):-1]
        target = src.model_copy(update={"bucket": bucket}) if src is not None else _BucketOnly(bucket)
        staged, skipped = s3_ingest.download(platform.s3.for_threads(platform.s3.endpoint_for(src), threads),
                                             target, files, staging, threads)
        for f, why in skipped:
            s3_ingest.log.warning("%s: skipping %s: %s", what, f.key, why)
        return staged, str(staging)

    def dataset_name(self, src: Source) -> tuple[str, str]:
        return "s3", f"{src.bucket}/{src.prefix}".rstrip("/")


class _BucketOnly:
    """A bucket named by a load request, without a source in metadata."""

    def __init__(self, bucket: str):
        self.bucket = bucket
