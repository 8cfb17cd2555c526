"""A local (or mounted) landing directory."""

from __future__ import annotations

import fnmatch
import os
from typing import TYPE_CHECKING

from lakehouse.ingest import files as file_ingest
from lakehouse.ingest.arrivals import ArrivalDecision, poll_local
from lakehouse.ingest.checkpoints import processed_files
from lakehouse.ingest.dated import only_day
from lakehouse.ingest.files import FileRef, landing_root, list_local_files, local_etag
from lakehouse.ingest.paths import confine, walk_files
from lakehouse.runtime.coordination import claim_new_files, keep_claims
from lakehouse.sources.base import register
from lakehouse.sources.filebased import FileSourceAdapter
from lakehouse.stage.core import ExtractPlan, StageContext

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform


@register
class FilesAdapter(FileSourceAdapter):
    kind = "files"

    def plan(self, ctx: StageContext, src: Source, plan: ExtractPlan) -> None:
        """The landing directory's files not yet on main and not claimed by another live run."""
        landing = ctx.platform.settings.landing_dir
        found = only_day(src, list_local_files(src, landing), ctx.run_tags)  # a dated run: that day alone
        tables = ctx.platform.tables()
        ident = ctx.target.identifier
        done = processed_files(ctx.platform, tables, ident) if tables.exists(ident) else set()
        new = [f for f in found if (f.key, f.etag) not in done]
        mine, taken = claim_new_files(ctx, new)
        plan.files = keep_claims(ctx, file_ingest.select_for_run(mine, src), mine)
        plan.details = {"files_found": len(found), "files_new": len(new), "files_planned": len(plan.files)}
        if taken:
            plan.details["files_claimed_by_other_runs"] = taken
        if not plan.files:
            plan.skipped_reason = (f"no new files in {landing_root(src, landing)}"
                                   + (f" that no other run is loading ({taken})" if taken else ""))

    def probe(self, platform: Platform, src: Source) -> tuple[bool, str]:
        root = landing_root(src, platform.settings.landing_dir)
        try:
            if not root.is_dir():
                return False, f"landing directory {root} does not exist"
            if not os.access(root, os.R_OK | os.X_OK):
                return False, f"landing directory {root} is not readable"
            next(iter(os.scandir(root)), None)  # raises on an unreadable directory
        except OSError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"{root} readable"

    def poll(self, platform: Platform, src: Source, cursor: str | None, identifier: str | None) -> ArrivalDecision:
        return poll_local(platform, src, cursor, identifier)

    def list_files(self, platform: Platform, src: Source) -> list[FileRef]:
        return list_local_files(src, platform.settings.landing_dir)

    def find_files(self, platform: Platform, src: Source | None, keys: list[str], patterns: list[str],
                   what: str, bucket: str | None = None) -> tuple[list[FileRef], str]:
        """Files under the landing root named by key (no '..', no symlink out) or matching a pattern."""
        root = landing_root(src, platform.settings.landing_dir)
        found: dict[str, FileRef] = {}
        for k in keys:
            p = confine(root, k, f"{what}: file key")
            if not p.is_file():
                raise FileNotFoundError(f"{what}: file key {k!r} not found under {root}")
            found[k] = FileRef(k, p.stat().st_size, local_etag(p), str(p))
        for pat in patterns:
            for rel, p, refused in walk_files(root):
                if refused is None and fnmatch.fnmatchcase(rel, pat):
                    found[rel] = FileRef(rel, p.stat().st_size, local_etag(p), str(p))
        return sorted(found.values(), key=lambda f: f.key), f"file://{root}/"

    def dataset_name(self, src: Source) -> tuple[str, str]:
        return "file", (src.path or src.source_id).strip("/")
