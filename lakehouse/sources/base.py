"""The source adapter interface and its registry: one adapter per kind of input.

A stage talks to what it reads only through this interface (the pattern of dlt's destination
clients and PyIceberg's FileIO by scheme): the runner, healing, recovery, lineage and the
entity_raw loader ask `adapter_for(kind)` instead of switching on `source.kind`. A new source
kind is one module under `lakehouse/sources/` with a `@register`ed subclass; nothing else
changes. The metadata model still validates each kind's fields (lakehouse.metadata.model).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from lakehouse.errors import source_unreachable

if TYPE_CHECKING:
    from lakehouse.ingest.arrivals import ArrivalDecision
    from lakehouse.ingest.files import FileRef
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform
    from lakehouse.stage.core import Batch, ExtractPlan, StageContext, StageOutcome
    from lakehouse.table.publish import PublishResult

class SourceAdapter:
    """How the platform plans, reads, finishes, probes and recovers one kind of input.

    Stage hooks get the step's `StageContext`; probes get the `Platform` (they also run outside
    a step: recovery routes, `lakehouse lineage paths`). The defaults suit a source that is
    re-read whole and has no files of its own.
    """

    kind: ClassVar[str]
    #: read the target's main before planning: the publish then checks what other runs committed
    plans_against_main: ClassVar[bool] = False
    #: the input is a set of files (checkpoints, claims, quarantine of unreadable files)
    reads_files: ClassVar[bool] = False
    #: DataHub's sub-type of the source's dataset
    subtype: ClassVar[str] = "Source"

    # ------------------------------------------------------------------ a stage's extract and load
    def plan(self, ctx: StageContext, src: Source | None, plan: ExtractPlan) -> None:
        """Fill `plan` with what the load step will read (files, snapshots, a staged copy)."""
        raise NotImplementedError(f"source kind {self.kind!r} cannot be planned as a stage input")

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        """The planned input, one Iceberg commit per batch."""
        raise NotImplementedError(f"source kind {self.kind!r} cannot be read as a stage input")

    def after_publish(self, ctx: StageContext, plan: ExtractPlan, outcome: StageOutcome) -> None:
        """What the source's bookkeeping needs once the data is on main (cursors, staged copies)."""

    def remainder(self, plan: ExtractPlan, result: PublishResult) -> ExtractPlan | None:
        """The part of `plan` nobody else published, when the publish found some of it on main
        (None: nothing is left). Default: the input cannot be split, write it again whole."""
        return plan

    # ------------------------------------------------------------------ health and recovery
    def probe(self, platform: Platform, src: Source) -> tuple[bool, str]:
        """(available, why): a cheap check that the source can be read right now; never raises."""
        return False, f"no probe for source kind {self.kind!r}"

    def is_unavailable(self, exc: BaseException) -> bool:
        """Does this error mean "the source cannot be read now" (reroute), rather than bad data or a
        bug? By default the one error mapper's answer (lakehouse.errors.source_unreachable)."""
        return source_unreachable(exc)

    def file_readable(self, ctx: StageContext, f: FileRef) -> bool:
        """Can this input file be read on its own? (healing's quarantine_input asks)."""
        return True

    def quarantine_files(self, ctx: StageContext, files: list[FileRef], reason: str) -> list[str]:
        """Set unreadable input files aside so the step goes on without them; where they went."""
        return []

    # ------------------------------------------------------------------ outside a stage
    def poll(self, platform: Platform, src: Source, cursor: str | None, identifier: str | None) -> ArrivalDecision:
        """New input since `cursor` (the arrival sensor)."""
        raise NotImplementedError(f"source kind {self.kind!r} has no arrivals to poll")

    def list_files(self, platform: Platform, src: Source) -> list[FileRef]:
        """Every file the source holds now (entity_raw loads without a request)."""
        raise NotImplementedError(f"source kind {self.kind!r} holds no files")

    def find_files(self, platform: Platform, src: Source | None, keys: list[str], patterns: list[str],
                   what: str, bucket: str | None = None) -> tuple[list[FileRef], str]:
        """(files named by `keys` or matched by `patterns`, location prefix) for a load request."""
        raise NotImplementedError(f"source kind {self.kind!r} holds no files")

    def stage_files(self, platform: Platform, src: Source | None, files: list[FileRef], location: str,
                    run_id: str, what: str) -> tuple[list[FileRef], str | None]:
        """Local copies of `files` Spark can read (files, staging directory or None)."""
        return files, None

    def dataset_name(self, src: Source) -> tuple[str, str]:
        """(DataHub platform, dataset name) of the source."""
        return "iceberg", (src.table_identifier or src.source_id).lower()


_REGISTRY: dict[str, SourceAdapter] = {}


def register(cls: type[SourceAdapter]) -> type[SourceAdapter]:
    """Class decorator: one instance per kind (adapters hold no per-run state)."""
    if cls.kind in _REGISTRY and type(_REGISTRY[cls.kind]) is not cls:
        raise ValueError(f"source kind {cls.kind!r} is registered twice ({type(_REGISTRY[cls.kind]).__name__}, "
                         f"{cls.__name__})")
    _REGISTRY[cls.kind] = cls()
    return cls


#: kind -> the module that registers its adapter, imported on the kind's first lookup
BUILT_IN = {kind: f"lakehouse.sources.{kind}" for kind in ("entity_raw", "files", "iceberg", "jdbc", "python",
                                                           "s3", "sql")}


def registered_adapter(kind: str) -> SourceAdapter:
    if kind not in _REGISTRY and kind in BUILT_IN:
        import importlib

        importlib.import_module(BUILT_IN[kind])
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise KeyError(f"no source adapter for kind {kind!r}; known kinds: {registered_kinds()}") from None


def registered_kinds() -> list[str]:
    return sorted(set(_REGISTRY) | set(BUILT_IN))
