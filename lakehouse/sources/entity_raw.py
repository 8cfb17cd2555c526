"""entity_raw: raw records of a registered application, loaded from the application's source.

An application's files live behind a `files` or `s3` source (or a bucket a load request names);
this adapter finds, lists and stages them through that source's adapter, so the entity_raw
loader (lakehouse.stage.entity_raw) never asks which kind it is. Its `plan`/`batches` are the base
class's refusals: entity_raw tables are written by `lakehouse.stage.entity_raw.load`, not by a stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakehouse.ingest.files import FileRef
from lakehouse.sources.base import SourceAdapter, register, registered_adapter

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform


def _files_of(src: Source | None) -> SourceAdapter:
    """The adapter that holds an application's files: a landing directory's when its source is
    one, else S3 (its source's bucket, or the bucket a load request names)."""
    return registered_adapter("files" if src is not None and src.kind == "files" else "s3")


@register
class EntityRawAdapter(SourceAdapter):
    kind = "entity_raw"

    def probe(self, platform: Platform, src: Source) -> tuple[bool, str]:
        return _files_of(src).probe(platform, src)

    def list_files(self, platform: Platform, src: Source) -> list[FileRef]:
        return _files_of(src).list_files(platform, src)

    def find_files(self, platform: Platform, src: Source | None, keys: list[str], patterns: list[str],
                   what: str, bucket: str | None = None) -> tuple[list[FileRef], str]:
        return _files_of(src).find_files(platform, src, keys, patterns, what, bucket)

    def stage_files(self, platform: Platform, src: Source | None, files: list[FileRef], location: str,
                    run_id: str, what: str) -> tuple[list[FileRef], str | None]:
        return _files_of(src).stage_files(platform, src, files, location, run_id, what)

    def dataset_name(self, src: Source) -> tuple[str, str]:
        return _files_of(src).dataset_name(src)
