"""The ground floor of a stage run: the plan, the batches, the outcome and the step's context.

Feature modules (ingest, validation, healing, lineage, export, alerts) receive a `StageContext`
and return or fill these types; none of them imports `lakehouse.stage.runner`, which sits above them
and only orchestrates. That keeps the dependencies pointing down (docs/ARCHITECTURE.md) and
lets a feature be tested with a context built from metadata, without the runner.

Below it sit only the platform's services (metadata, settings, Iceberg, S3, Spark: `Platform`)
and the rule types it names; import-linter's layers contract in pyproject.toml keeps it so.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from lakehouse.metadata.model import MetadataCatalog, Pipeline, Rule, Source, Stage, Target

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    #: a batch's rows in the frame of the engine that read them (lakehouse.engines): a Spark
    #: DataFrame, or a pyarrow Table on the Arrow engine
    Frame = DataFrame | pa.Table

    from lakehouse.metadata.derive import StageDerivation
    from lakehouse.platform import Platform
    from lakehouse.table.iceberg import WriteResult, WriteSpec
    from lakehouse.validation.rules import CheckOutcome

log = logging.getLogger("lakehouse.stage.runner")

#: the plan kind of a stage that reads Iceberg tables through its SQL (or has no source)
SQL = "sql"
#: the plan kind of a stage computed by a Python function (lakehouse.sources.python)
PYTHON = "python"
#: the plan kind of an extract that a source/target kill switch skipped
SKIPPED = "skipped"


#: file checkpoint statuses: rows committed / zero bytes (nothing to read) / unreadable, kept out of the table
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


class StageDisabled(RuntimeError):
    """The control flags say this pipeline/stage must not run (or publish) now."""


class DatasetDisabled(StageDisabled):
    """The stage's source or target is switched off in control_flags: the step is skipped, not failed."""


class AuditFailed(RuntimeError):
    """A blocking (error-severity) rule failed: main is untouched, the branch is kept."""

    def __init__(self, message: str, outcomes: list[CheckOutcome], branch: str):
        super().__init__(message)
        self.outcomes = outcomes
        self.branch = branch


class NoRecoveryPath(RuntimeError):
    """No route into the dataset has every dataset on it available (lakehouse.lineage.recovery)."""

    def __init__(self, message: str, routes: list | None = None):
        super().__init__(message)
        self.routes = routes or []


class FileReader(Protocol):
    """How an engine reads some files of a batch (lakehouse.engines.isolate asks, after a failed read)."""

    def frame(self, files: list[FileRef]) -> Frame:
        """The engine's frame over `files` (all of them readable, as far as is known)."""
        ...

    def check(self, files: list[FileRef]) -> None:
        """Read `files` to the last value, writing nothing; raises what reading them raises."""
        ...


@dataclass
class Batch:
    """One Iceberg commit's worth of input, as the frame of the engine that reads it (`engine`)."""

    df: Frame
    snapshot_properties: dict[str, str] = field(default_factory=dict)
    files: list[FileRef] = field(default_factory=list)
    label: str = ""
    write: WriteSpec | None = None  # how this batch is written when not by the target's write_mode
    #: how the engine reads `files` again (a subset of them): what finds the file a failed batch
    #: read fails on (lakehouse.engines.isolate); None for input that is not files
    reader: FileReader | None = None

    @property
    def engine(self) -> str:
        """The engine whose frame `df` is: `arrow` (a pyarrow Table) or `spark` (a Spark DataFrame)."""
        return "arrow" if type(self.df).__module__.startswith("pyarrow") else "spark"


@dataclass
class ExtractPlan:
    """What the load step will read; small and picklable (it crosses the op boundary)."""

    pipeline_id: str
    stage_name: str
    kind: str
    files: list[FileRef] = field(default_factory=list)
    upstream_snapshots: dict[str, int | None] = field(default_factory=dict)
    staged_path: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    skipped_reason: str | None = None
    source_id: str | None = None
    main_at_plan: int | None = None  # the target's main when planned: the publish checks what came after


@dataclass
class StageOutcome:
    pipeline_id: str
    stage_name: str
    target: Target
    published: bool
    branch: str
    writes: list[WriteResult] = field(default_factory=list)
    checks: list[CheckOutcome] = field(default_factory=list)
    snapshot_id: int | None = None
    #: logical: rows the stage's logic wrote (inserted + updated); `add_write` keeps the counts
    rows_written: int = 0
    quarantined_rows: int = 0
    skipped_reason: str | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    rows_in: int = 0  # rows of the batches that were written (a merge: its change set), quarantined ones aside
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0  # removed by the logic (a replace-where overwrite)
    #: physical: rows of the data files the commits wrote / removed (a MERGE rewrites whole files)
    rows_rewritten: int = 0
    physical_rows_deleted: int = 0

    def add_write(self, res: WriteResult) -> None:
        """Count one commit: its logical counts (`WriteResult.logical`) and its physical ones."""
        self.writes.append(res)
        counts = res.logical()
        self.rows_in += counts["rows_in"]
        self.rows_inserted += counts["rows_inserted"]
        self.rows_updated += counts["rows_updated"]
        self.rows_deleted += counts["rows_deleted"]
        self.rows_written = self.rows_inserted + self.rows_updated
        self.rows_rewritten += res.rows_written
        self.physical_rows_deleted += res.physical_rows_deleted

    def reset_counts(self) -> None:
        """Forget the writes (they were dropped with their branch; the remainder is written again)."""
        self.writes = []
        self.rows_written = self.quarantined_rows = self.rows_in = self.rows_inserted = 0
        self.rows_updated = self.rows_deleted = self.rows_rewritten = self.physical_rows_deleted = 0

    @property
    def rows_dropped(self) -> int:
        """Input rows a drop rule removed (its check's details)."""
        return sum(int(c.details.get("dropped", 0) or 0) for c in self.checks
                   if c.details.get("action") == "drop")

    @property
    def rows_read(self) -> int:
        """The input rows of the stage's batches: written (or left as they were: a merge's older
        rows), quarantined or dropped."""
        return self.rows_in + self.quarantined_rows + self.rows_dropped

    def metadata(self) -> dict[str, Any]:
        """Materialization metadata: what a person needs to trust the table, never secrets.

        Logical counts (what the stage's logic did): rows_read, rows_inserted, rows_updated,
        rows_deleted, quarantined_rows, and rows_written (inserted + updated); physical counts (the
        data files Iceberg wrote and removed, which a copy-on-write MERGE rewrites whole):
        rows_rewritten, physical_rows_deleted."""
        md: dict[str, Any] = {
            "table": f"{self.target.identifier}",
            "snapshot_id": str(self.snapshot_id) if self.snapshot_id is not None else "none",
            "rows_read": self.rows_read,
            "rows_inserted": self.rows_inserted,
            "rows_updated": self.rows_updated,
            "rows_deleted": self.rows_deleted,
            "rows_written": self.rows_written,
            "quarantined_rows": self.quarantined_rows,
            "rows_rewritten": self.rows_rewritten,
            "physical_rows_deleted": self.physical_rows_deleted,
            "commits": len(self.writes),
            "write_mode": self.target.write_mode,
            "published": self.published,
            "audit_branch": self.branch,
            "duration_s": round(self.duration_s, 3),
        }
        if self.target.partition_spec:
            md["partition_spec"] = ", ".join(
                p.transform + ("" if p.param is None else f"[{p.param}]") + f"({p.column})"
                for p in self.target.partition_spec
            )
        if self.skipped_reason:
            md["skipped_reason"] = self.skipped_reason
        md.update(self.extra)
        return md


@dataclass
class HealingState:
    """What self-healing changed for the rest of this step (lakehouse.control.healing writes it,
    the runner and the source adapters read it)."""

    batch_scale: float = 1.0
    quarantined_files: dict[str, str] = field(default_factory=dict)  # file key -> reason
    #: files left for the next run (vanished or changed since the plan): key -> why; not read again
    skipped_files: dict[str, str] = field(default_factory=dict)
    attempts: Counter = field(default_factory=Counter)  # healing_id -> attempts
    total_attempts: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    def effective_batch(self, configured: int) -> int:
        return max(1, int(configured * self.batch_scale))

    def summary(self) -> dict[str, Any]:
        """For materialization metadata: short, no secrets (messages are truncated)."""
        out: dict[str, Any] = {"healing_attempts": self.total_attempts}
        if self.events:
            out["healing"] = self.events
        if self.quarantined_files:
            out["quarantined_files"] = sorted(self.quarantined_files)
        if self.batch_scale != 1.0:
            out["batch_scale"] = self.batch_scale
        return out


def resolve_source(catalog: MetadataCatalog, dataset_id: str) -> Source | None:
    """What a stage reads for a dataset id: the source itself, or a target read as an Iceberg table
    (a recovery upstream or a declared replica)."""
    src = next((s for s in catalog.sources if s.source_id == dataset_id), None)
    if src is not None:
        return src
    tgt = next((t for t in catalog.targets if t.target_id == dataset_id and t.kind == "iceberg"), None)
    if tgt is not None:
        return Source(source_id=dataset_id, kind="iceberg", table_identifier=tgt.identifier,
                      description=f"target {dataset_id} read as a recovery upstream")
    return None


class StageContext:
    """One stage of one pipeline in one run, as the feature modules see it.

    It carries the step's identity (run id, stage, pipeline, source, target), the run's tags, an
    audit sink (`audit`), and the state of this step that several features share: the ingest
    report, the batch being written, the batches read so far, what healing changed and where
    recovery pointed the read. Two hooks are bound by the orchestrator above (lakehouse.stage.runner),
    so features below it reach the source adapters and the lineage reroute without importing
    them: `adapter_for(kind)` and `reroute(error)`.
    """

    def __init__(self, platform: Platform, pipeline_id: str, stage_name: str, run_id: str | None = None,
                 logger: logging.Logger | None = None, *, catalog: MetadataCatalog | None = None,
                 run_tags: dict[str, str] | None = None):
        self.platform = platform
        self.run_id = run_id or uuid.uuid4().hex
        self.log = logger or log
        self.catalog = catalog if catalog is not None else platform.catalog()
        self.stage: Stage = self.catalog.stage(pipeline_id, stage_name)
        self.pipeline: Pipeline = self.catalog.pipeline(pipeline_id)
        self.target: Target = self.catalog.target(self.stage.target_id)
        self._init_state(run_tags)

    @classmethod
    def for_write(cls, platform: Platform, stage: Stage, target: Target, run_id: str | None = None,
                  logger: logging.Logger | None = None, *, catalog: MetadataCatalog | None = None) -> StageContext:
        """A context for a write no metadata stage describes (an entity_raw load): the caller names
        the stage (source, rule set) and the target it writes as. Its kill switch is the platform's
        flag and its datasets' flags (no pipeline row to read)."""
        ctx = cls.__new__(cls)
        ctx.platform = platform
        ctx.run_id = run_id or uuid.uuid4().hex
        ctx.log = logger or log
        ctx.catalog = catalog if catalog is not None else platform.catalog()
        ctx.stage, ctx.target = stage, target
        ctx.pipeline = Pipeline(pipeline_id=stage.pipeline_id)
        ctx._init_state(None)
        ctx.described_by_metadata = False
        return ctx

    def _init_state(self, run_tags: dict[str, str] | None) -> None:
        self.described_by_metadata = True  # its pipeline and stage rows exist (their flags apply)
        self.run_tags: dict[str, str] = dict(run_tags or {})  # e.g. the arrival sensor's lakehouse/arrival_batch
        self.source_override: str | None = None  # set by a lineage reroute (lakehouse.lineage.recovery)
        self.table_overrides: dict[str, str] = {}  # SQL upstream -> replica (recovery.sql_table_overrides)
        self.healing = HealingState()  # what self-healing changed for this step
        self.report: dict[str, Any] = {}  # the ingest report: quarantined / empty files, schema changes
        self.batches_read = 0  # file batches read so far in this step (crash points tell first from later)
        self.current_batch: Batch | None = None  # the batch being written when an error happened
        self.adapter_for: Callable[[str], Any] | None = None  # lakehouse.sources.adapter_for
        self.reroute: Callable[[BaseException], Any] | None = None
        # upstream tables handed in as asset inputs: loaders of the Dagster IO manager (reading the
        # run's pinned snapshots, lakehouse.stage.pins), called only when a SQL or Python stage reads them
        self.upstream_frames: dict[str, Callable[[], DataFrame]] = {}
        self._stored_derivation: dict[tuple[str, str], StageDerivation] | None = None  # stored_derivation()

    def stored_derivation(self) -> dict[tuple[str, str], StageDerivation]:
        """{(pipeline_id, stage_name): what apply stored} for this SQL stage when it is up to date with
        the rows as stored now (`lakehouse.metadata.derived.stored_derivations`); {} otherwise, and the
        lineage callers parse its SQL as before. Read once per step: the recovery check and the lineage
        emission (a forked child inherits it) ask the same question."""
        if not self.stage.transformation:
            return {}  # nothing to parse
        if self._stored_derivation is None:
            from lakehouse.metadata.derived import stored_derivations

            self._stored_derivation = stored_derivations(self.platform.store, self.catalog, [self.stage])
        return self._stored_derivation

    @property
    def source(self) -> Source | None:
        if self.source_override:
            return resolve_source(self.catalog, self.source_override)
        sid = self.stage.source_id
        if sid is None:
            return None
        return next((s for s in self.catalog.sources if s.source_id == sid), None)

    @property
    def source_kind(self) -> str:
        """The adapter kind this step reads with: a source's kind, or `sql` for a transformation."""
        if self.stage.python_transformation is not None:
            return PYTHON
        src = self.source
        return SQL if src is None or self.stage.transformation else src.kind

    def adapter(self) -> Any:
        """The source adapter (lakehouse.sources.base.SourceAdapter) of what this step reads now;
        it changes when recovery reroutes. Typed loosely: the ground floor knows no adapter."""
        if self.adapter_for is None:
            raise RuntimeError("no source adapter registry bound to this stage context (lakehouse.stage.runner binds it)")
        return self.adapter_for(self.source_kind)

    @property
    def rules(self) -> list[Rule]:
        if not self.stage.validation_set_id:
            return []
        return self.catalog.rule_set(self.stage.validation_set_id).rules

    def schema_policy(self) -> str:
        """The stage's schema policy: its schema_contract rule's `schema_policy`, else the target's
        table property `lakehouse.schema_policy`, else `evolve`."""
        for r in self.rules:
            if r.type == "schema_contract" and r.enabled:
                return r.schema_policy
        return self.target.table_properties.get("lakehouse.schema_policy", "evolve")

    def audit(self, event: str, **fields: Any) -> None:
        """The audit sink: one audit_log row naming this run, stage and dataset."""
        self.platform.store.audit(run_id=self.run_id, pipeline_id=self.stage.pipeline_id,
                                  stage_name=self.stage.stage_name, dataset=self.target.identifier,
                                  event=event, **fields)
