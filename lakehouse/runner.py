"""Runs one stage: extract (plan the input) → write to an audit branch → validate → publish.

This is the platform's domain core; the Dagster assets in `lakehouse_assets` are a thin shell
around `StageRunner.extract` (the op in the source's pool) and `StageRunner.load` (the op in
the target's pool). Operational metadata (flags, rules, retry and healing) is read from the
control database on every call, so a metadata update applies to the next step without a redeploy.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.iceberg import IcebergTables, WriteResult, branch_name_for_run
from lakehouse.ingest import files as file_ingest
from lakehouse.metadata.model import MetadataCatalog, Pipeline, Rule, Source, Stage, Target
from lakehouse.metadata.store import MetadataStore
from lakehouse.settings import Settings, load_settings
from lakehouse.validation import CheckOutcome

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


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


@dataclass
class Platform:
    """Everything a stage needs from the outside world, built from settings."""

    settings: Settings
    store: MetadataStore

    def __post_init__(self) -> None:
        from lakehouse.fileperms import apply_umask

        apply_umask()  # what the platform creates is owner-only (LAKEHOUSE_UMASK)

    @classmethod
    def from_env(cls) -> Platform:
        s = load_settings()
        return cls(s, MetadataStore(s.control_db_url))

    def spark(self) -> SparkSession:
        from lakehouse.spark import get_spark

        return get_spark(self.settings)

    def warm_spark(self) -> threading.Thread:
        """Start the process's SparkSession and its Iceberg catalog in the background (a cold JVM
        takes seconds); the first `spark()` call waits for the session. A failure here is left
        for that call to raise."""

        def start() -> None:
            try:
                from lakehouse.iceberg import quote

                # the first statement initializes Spark SQL and the Iceberg catalog: seconds more
                self.spark().sql(f"SHOW NAMESPACES IN {quote(self.settings.catalog_name)}").collect()
            except Exception:  # noqa: BLE001 - reported by the caller's own spark() call
                log.debug("background Spark start failed", exc_info=True)

        thread = threading.Thread(target=start, name="spark-warmup", daemon=True)
        thread.start()
        return thread

    def tables(self) -> IcebergTables:
        # Spark is started on first use only: planning and skipping read metadata with PyIceberg
        return IcebergTables(self.spark, self.settings.catalog_name, self.pyiceberg_catalog())

    def pyiceberg_catalog(self):
        """PyIceberg view of the same catalog (same name, same database): metadata reads without Spark."""
        from lakehouse.catalog import pyiceberg_catalog

        return pyiceberg_catalog(self.settings)

    def catalog(self) -> MetadataCatalog:
        return self.store.load()


@dataclass
class Batch:
    """One Iceberg commit's worth of input."""

    df: DataFrame
    snapshot_properties: dict[str, str] = field(default_factory=dict)
    files: list[file_ingest.FileRef] = field(default_factory=list)
    label: str = ""


@dataclass
class ExtractPlan:
    """What the load step will read; small and picklable (it crosses the op boundary)."""

    pipeline_id: str
    stage_name: str
    kind: str
    files: list[file_ingest.FileRef] = field(default_factory=list)
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
    rows_written: int = 0
    quarantined_rows: int = 0
    skipped_reason: str | None = None
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        """Materialization metadata: what a person needs to trust the table, never secrets."""
        md: dict[str, Any] = {
            "table": f"{self.target.identifier}",
            "snapshot_id": str(self.snapshot_id) if self.snapshot_id is not None else "none",
            "rows_written": self.rows_written,
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
        if self.quarantined_rows:
            md["quarantined_rows"] = self.quarantined_rows
        if self.skipped_reason:
            md["skipped_reason"] = self.skipped_reason
        md.update(self.extra)
        return md


class StageRunner:
    """One stage of one pipeline in one run."""

    def __init__(self, platform: Platform, pipeline_id: str, stage_name: str, run_id: str | None = None,
                 logger: logging.Logger | None = None):
        self.platform = platform
        self.run_id = run_id or uuid.uuid4().hex
        self.log = logger or log
        self.catalog = platform.catalog()
        self.stage: Stage = self.catalog.stage(pipeline_id, stage_name)
        self.pipeline: Pipeline = self.catalog.pipeline(pipeline_id)
        self.target: Target = self.catalog.target(self.stage.target_id)
        self.source_override: str | None = None  # set by lakehouse.lineage.recovery.reroute
        self.table_overrides: dict[str, str] = {}  # SQL upstream -> replica (recovery.sql_table_overrides)
        from lakehouse.control.healing import HealingState

        self.healing = HealingState()  # what self-healing changed for this step (lakehouse.control.healing)

    # ------------------------------------------------------------------ helpers
    @property
    def source(self) -> Source | None:
        sid = self.stage.source_id
        if self.source_override:
            from lakehouse.lineage.recovery import resolve_source

            return resolve_source(self.catalog, self.source_override)
        if sid is None:
            return None
        return next((s for s in self.catalog.sources if s.source_id == sid), None)

    @property
    def rules(self) -> list[Rule]:
        if not self.stage.validation_set_id:
            return []
        return self.catalog.rule_set(self.stage.validation_set_id).rules

    def audit(self, event: str, **fields: Any) -> None:
        self.platform.store.audit(run_id=self.run_id, pipeline_id=self.stage.pipeline_id,
                                  stage_name=self.stage.stage_name, dataset=self.target.identifier,
                                  event=event, **fields)

    def require_enabled(self, when: str) -> None:
        from lakehouse import alerts
        from lakehouse.control.flags import dataset_gate

        ok, reason = self.platform.store.enabled(self.stage.pipeline_id, self.stage.stage_name)
        if not ok:
            self.audit("kill_switch", outcome="stopped", message=f"{when}: {reason}")
            exc = StageDisabled(f"{reason}; stopped {when}. Re-enable with "
                                f"`lakehouse pipeline enable {self.stage.pipeline_id}` or "
                                f"`lakehouse stage enable {self.stage.pipeline_id} {self.stage.stage_name}`.")
            alerts.kill_switch_stopped(self, str(exc))
            raise exc
        gate = dataset_gate(self.platform.store, [self.stage.source_id, self.source_override], self.target.target_id)
        if not gate.ok:
            self.audit("kill_switch", outcome="skipped", message=f"{when}: {gate.reason}")
            exc = DatasetDisabled(f"{gate.reason}; {self.target.identifier} (stage {self.stage.pipeline_id}."
                                  f"{self.stage.stage_name}) skipped {when}. Re-enable with `{gate.enable_command}`.")
            alerts.kill_switch_stopped(self, str(exc))
            raise exc

    # ------------------------------------------------------------------ extract
    def extract(self) -> ExtractPlan:
        try:
            self.require_enabled("before extract")
        except DatasetDisabled as exc:  # a source/target switched off: nothing to read, the load skips too
            return ExtractPlan(self.stage.pipeline_id, self.stage.stage_name, kind="skipped",
                               source_id=self.stage.source_id, skipped_reason=str(exc))
        from lakehouse import coordination

        coordination.hold_lease(self.platform, self.run_id, self.target.identifier)  # claims live with it
        try:
            plan = self._extract()
        except BaseException:
            coordination.release_lease(self.platform, self.run_id, self.target.identifier)
            raise
        coordination.end_step(self.platform, self.run_id, self.target.identifier)
        return plan

    def _extract(self) -> ExtractPlan:
        from lakehouse.control.deadline import guard_step
        from lakehouse.control.healing import run_with_healing
        from lakehouse.lineage.recovery import extract_with_recovery

        # probes the default upstream and reroutes over the lineage graph when it is down;
        # any other matched error is healed (healing_actions) and the extract retried in this step
        def attempt() -> ExtractPlan:
            from lakehouse.control import faults

            faults.inject("extract", self, source_id=self.source_override or self.stage.source_id)
            return guard_step(self, "extract", lambda: extract_with_recovery(self, self._plan_extract))

        plan = run_with_healing(self, "extract", attempt)
        if self.healing.events:
            plan.details.update({f"extract_{k}": v for k, v in self.healing.summary().items()})
        return plan

    def _plan_extract(self) -> ExtractPlan:
        src = self.source
        plan = ExtractPlan(self.stage.pipeline_id, self.stage.stage_name,
                           kind=src.kind if src else "sql", source_id=src.source_id if src else None)
        if src is not None and not self.stage.transformation and src.kind in ("files", "s3", "jdbc"):
            tables = self.platform.tables()  # read before anything is planned: later commits get checked
            plan.main_at_plan = tables.snapshot_id(self.target.identifier) if tables.exists(self.target.identifier) else None
        if src is None or self.stage.transformation:
            plan.kind = "sql"
            plan.upstream_snapshots = self._pin_upstream()
        elif src.kind == "files":
            self._plan_local_files(src, plan)
        elif src.kind == "iceberg":
            plan.upstream_snapshots = {src.table_identifier: self.platform.tables().snapshot_id(src.table_identifier)}
        else:
            from importlib import import_module

            # s3 / jdbc extraction live in their own modules (lakehouse.ingest.s3 / .jdbc)
            import_module(f"lakehouse.ingest.{src.kind}").plan(self, src, plan)
        return plan

    def upstream_identifiers(self) -> list[str]:
        from lakehouse.sqlparse import tables_in_sql

        if self.stage.transformation:
            return tables_in_sql(self.stage.transformation)
        src = self.source
        if src is None:
            return []
        if src.kind == "iceberg":
            return [src.table_identifier]
        up = self.catalog.target(src.source_id) if any(t.target_id == src.source_id for t in self.catalog.targets) else None
        return [up.identifier] if up else []

    def _pin_upstream(self) -> dict[str, int | None]:
        tables = self.platform.tables()
        return {ident: tables.snapshot_id(self.table_overrides.get(ident, ident))  # a replica, when rerouted
                for ident in self.upstream_identifiers()}

    def processed_files(self) -> set[tuple[str, str]]:
        """(key, etag) of every file already committed to main, from the snapshot summaries."""
        tables = self.platform.tables()
        ident = self.target.identifier
        if not tables.exists(ident):
            return set()
        from lakehouse.ingest.checkpoints import processed_files

        return processed_files(self.platform, tables, ident)

    def _plan_local_files(self, src: Source, plan: ExtractPlan) -> None:
        found = file_ingest.list_local_files(src, self.platform.settings.landing_dir)
        done = self.processed_files()
        new = [f for f in found if (f.key, f.etag) not in done]
        mine, taken = self.claim_new_files(new)
        plan.files = self.keep_claims(file_ingest.select_for_run(mine, src), mine)
        plan.details = {"files_found": len(found), "files_new": len(new), "files_planned": len(plan.files)}
        if taken:
            plan.details["files_claimed_by_other_runs"] = taken
        if not plan.files:
            plan.skipped_reason = (f"no new files in {file_ingest.landing_root(src, self.platform.settings.landing_dir)}"
                                   + (f" that no other run is loading ({taken})" if taken else ""))

    def claim_new_files(self, new: list) -> tuple[list, str]:
        """(the new files this run claimed, what live runs are loading instead) — lakehouse.coordination."""
        from lakehouse import coordination

        if not new or not coordination.claims_enabled(self.catalog):
            return new, ""
        mine, res = coordination.claim_files(self.platform, self.target.identifier, self.run_id, new)
        if res.taken:
            self.audit("files_claimed_elsewhere", outcome="skipped", message=res.message(),
                       details={"by_run": {k: len(v) for k, v in res.taken.items()}})
        return mine, res.message()

    def keep_claims(self, picked: list, mine: list) -> list:
        """Give back the claims on files this run will not load after all (per-run caps)."""
        from lakehouse import coordination

        rest = [(f.key, f.etag) for f in mine if f not in set(picked)]
        if rest:
            coordination.release_claims(self.platform, self.target.identifier, self.run_id, rest)
        return picked

    # ------------------------------------------------------------------ load
    def input_batches(self, plan: ExtractPlan) -> Iterator[Batch]:
        spark = self.platform.spark()
        if plan.kind == "sql":
            yield Batch(self._run_sql(plan), {"lakehouse.upstream": _json(plan.upstream_snapshots)}, label="sql")
        elif plan.kind in ("files", "s3"):
            src = self.source
            from lakehouse.ingest.checkpoints import read_batch
            from lakehouse.ingest.prepare import prepare_files

            todo = [f for f in plan.files if f.key not in self.healing.quarantined_files]
            done = 0  # progress for the run log: files done / total
            prepared = prepare_files(self, spark, src, todo)  # every file probed and reconciled on its own first
            for chunk in file_ingest.batches(prepared.files, self.healing.effective_batch(src.batch_files)):
                df, good, bad = read_batch(self, spark, src, chunk, prepared)
                done += len(chunk)
                props = {file_ingest.CHECKPOINT_PROPERTY: file_ingest.checkpoint_value(good + bad),
                         "lakehouse.run_id": self.run_id}
                if df is not None:
                    yield Batch(df, props, good, label=f"{len(good)} files, {done}/{len(todo)} files done")
        elif plan.kind == "iceberg":
            src = self.source
            snap = plan.upstream_snapshots.get(src.table_identifier)
            reader = spark.read.format("iceberg")
            if snap is not None:
                reader = reader.option("snapshot-id", str(snap))
            yield Batch(reader.load(f"{self.platform.settings.catalog_name}.{src.table_identifier}"), label="table")
        else:
            from importlib import import_module

            yield from import_module(f"lakehouse.ingest.{plan.kind}").batches(self, plan)

    def _run_sql(self, plan: ExtractPlan) -> DataFrame:
        from lakehouse.sqlparse import rewrite_tables

        spark = self.platform.spark()
        cat = self.platform.settings.catalog_name
        mapping = {}
        overrides = plan.details.get("table_overrides", {})  # an unavailable upstream read from its replica
        for ident, snap in plan.upstream_snapshots.items():
            view = "__lh_" + ident.replace(".", "__") + "_" + "".join(c if c.isalnum() else "_" for c in self.run_id[:8])
            reader = spark.read.format("iceberg")
            if snap is not None:
                reader = reader.option("snapshot-id", str(snap))
            reader.load(f"{cat}.{overrides.get(ident, ident)}").createOrReplaceTempView(view)
            mapping[ident.lower()] = view
        sql = self.stage.transformation or f"SELECT * FROM {next(iter(mapping.values()))}"
        from pyspark.errors import AnalysisException

        try:
            return spark.sql(rewrite_tables(sql, mapping))
        except AnalysisException as exc:  # the SQL does not fit the tables: a retry would fail the same way
            from lakehouse.errors import ConfigurationError

            raise ConfigurationError(
                f"stage {self.stage.pipeline_id}.{self.stage.stage_name}: its SQL does not fit the tables it reads "
                f"as they are now: {str(exc).strip().splitlines()[0][:500]}. Fix the SQL (or the upstream "
                "tables), then run again") from exc

    def load(self, plan: ExtractPlan) -> StageOutcome:
        """Write every batch to the run's audit branch, validate it, then publish to main.

        Runs under self-healing (lakehouse.control.healing): a matched error is resolved and the
        load restarts from a fresh audit branch in the same step; the trail lands in audit_log and
        in the materialization metadata.
        """
        from lakehouse import coordination
        from lakehouse.control.deadline import guard_step
        from lakehouse.control.healing import run_with_healing

        try:
            if plan.kind == "skipped":  # the extract skipped it (source/target off): re-check before any I/O
                self.require_enabled("before load")
            # the Spark work of each attempt is cancelled past the step's timeout (never a hung run)
            outcome = run_with_healing(self, "load", lambda: guard_step(self, "load", lambda: self._load(plan)))
        except DatasetDisabled as exc:  # switched off in flight: nothing reaches main, the step is skipped
            return self._skip_disabled(str(exc))
        finally:  # claims and the lease end with the step, whatever happened
            coordination.release_lease(self.platform, self.run_id, self.target.identifier)
        outcome.extra.update({k: v for k, v in plan.details.items() if k.startswith("extract_heal")})
        if self.healing.events or self.healing.total_attempts:
            outcome.extra.update(self.healing.summary())
        return outcome

    def _load(self, plan: ExtractPlan) -> StageOutcome:
        t0 = time.monotonic()
        tables = self.platform.tables()
        branch = branch_name_for_run(self.run_id)
        outcome = StageOutcome(self.stage.pipeline_id, self.stage.stage_name, self.target, False, branch)
        self.require_enabled("before load")
        outcome.extra.update(self.tidy_branches(tables))
        if tables.exists(self.target.identifier) and branch in tables.refs(self.target.identifier):
            # a retry of this step (healing or a Dagster retry): start over, never append twice
            tables.drop_branch(self.target.identifier, branch)
        if plan.source_id and self.stage.source_id and plan.source_id != self.stage.source_id:
            self.source_override = plan.source_id  # the extract rerouted: read what it planned
        if plan.skipped_reason:
            outcome.skipped_reason = plan.skipped_reason
            outcome.published = True
            outcome.snapshot_id = tables.snapshot_id(self.target.identifier) if tables.exists(self.target.identifier) else None
            outcome.duration_s = time.monotonic() - t0
            return outcome
        self.audit("stage_started", details={"plan": plan.details, "kind": plan.kind})
        plan = self._write_exactly_once(plan, outcome, t0)
        if plan is not None:
            self._after_publish(plan, outcome)
        return outcome

    def tidy_branches(self, tables: IcebergTables) -> dict:
        """Branches of dead runs and expired failed audits go before this run writes (lakehouse.branches)."""
        from lakehouse import coordination
        from lakehouse.branches import tidy_before_write
        from lakehouse.validation.quarantine import quarantine_identifier

        coordination.hold_lease(self.platform, self.run_id, self.target.identifier)
        return tidy_before_write(self.platform, tables, self.catalog, self.target.identifier, self.run_id,
                                 (quarantine_identifier(self.target.identifier),), self.target)

    def _write_exactly_once(self, plan: ExtractPlan, outcome: StageOutcome, t0: float,
                            max_rewrites: int = 8) -> ExtractPlan | None:
        """write-audit-publish; when the publish finds part of the input already on main (another
        run), write the remainder again on a fresh branch, or publish nothing. The plan published."""
        from lakehouse.publish import Superseded, remainder_plan

        for _ in range(max_rewrites):
            try:
                self.write_audit_publish(self.input_batches(plan), outcome=outcome, started=t0,
                                         since=plan.main_at_plan)
                return None if outcome.skipped_reason else plan
            except Superseded as sup:
                self._drop_own_branches()
                overlap = sup.result.overlap
                if overlap is not None:
                    self.audit("already_loaded", outcome="skipped", message=overlap.message(), details=overlap.details())
                    self.log.warning("%s: %s; publishing only the rest", self.target.identifier, overlap.message())
                    outcome.extra["already_loaded"] = "; ".join(
                        x for x in (outcome.extra.get("already_loaded"), overlap.message()) if x)
                    outcome.extra["files_already_loaded"] = (outcome.extra.get("files_already_loaded", 0)
                                                             + overlap.file_count)
                staged = plan.staged_path
                plan = remainder_plan(plan, sup.result)
                outcome.writes, outcome.rows_written, outcome.quarantined_rows = [], 0, 0
                if plan is None:
                    if staged:  # the downloaded / staged input is on main already, by another run
                        import shutil

                        shutil.rmtree(staged, ignore_errors=True)
                    outcome.skipped_reason = outcome.extra["already_loaded"]
                    outcome.published = True
                    tables = self.platform.tables()
                    outcome.snapshot_id = tables.snapshot_id(self.target.identifier)
                    outcome.duration_s = time.monotonic() - t0
                    return None
        raise RuntimeError(f"{self.target.identifier}: gave up after {max_rewrites} rewrites; other runs kept "
                           "publishing the same input (nothing of this run was published)")

    def _drop_own_branches(self) -> None:
        from lakehouse.branches import drop_branch_and_commits
        from lakehouse.validation.quarantine import quarantine_identifier

        tables = self.platform.tables()
        branch = branch_name_for_run(self.run_id)
        for ident in (self.target.identifier, quarantine_identifier(self.target.identifier)):
            if tables.exists(ident) and branch in tables.refs(ident):
                drop_branch_and_commits(tables, ident, branch)

    def _skip_disabled(self, reason: str) -> StageOutcome:
        """A source/target flag stopped this load: drop what this run put on its audit branches
        (the data is fine, it was just not allowed in) and report the step as skipped. Metadata
        reads go through PyIceberg, so a load skipped before writing never starts Spark."""
        from lakehouse.validation.quarantine import quarantine_identifier

        branch = branch_name_for_run(self.run_id)
        cat = self.platform.pyiceberg_catalog()
        snap = None
        for ident in (self.target.identifier, quarantine_identifier(self.target.identifier)):
            if not cat.table_exists(ident):
                continue
            meta = cat.load_table(ident).metadata
            if branch in meta.refs:
                self.platform.tables().drop_branch(ident, branch)
            if ident == self.target.identifier and "main" in meta.refs:
                snap = meta.refs["main"].snapshot_id
        self.log.warning("%s", reason)
        return StageOutcome(self.stage.pipeline_id, self.stage.stage_name, self.target, False, branch,
                            snapshot_id=snap, skipped_reason=reason)

    def write_audit_publish(self, batches, *, outcome: StageOutcome | None = None, started: float | None = None,
                            quarantine: bool = True, since: int | None | str = "now") -> StageOutcome:
        """Batches → audit branch → rules on the branch → kill switch → publish (see lakehouse.validation.wap).

        A failed blocking rule raises AuditFailed: main untouched, branch kept for inspection.
        `since`: the main snapshot the input was planned on (None: the table did not exist), so
        the publish can tell what other runs committed meanwhile; "now" when there was no plan.
        Raises lakehouse.publish.Superseded when some of the input is already on main.
        """
        from lakehouse.validation.wap import AuditedWrite

        t0 = started if started is not None else time.monotonic()
        tables = self.platform.tables()
        branch = branch_name_for_run(self.run_id)
        if outcome is None:
            outcome = StageOutcome(self.stage.pipeline_id, self.stage.stage_name, self.target, False, branch)
        from lakehouse import coordination

        coordination.hold_lease(self.platform, self.run_id, self.target.identifier)
        session = AuditedWrite(self, tables, branch, quarantine=quarantine, since=since)
        from lakehouse.throughput.ratelimit import StageThrottle

        # records_per_minute / bytes_per_hour of the source and the target, shared by all processes
        src = self.source
        throttle = StageThrottle.for_stage(self.platform.store, self.catalog, src.source_id if src else None,
                                           self.target.target_id)
        from lakehouse.control import faults

        for i, batch in enumerate(batches):
            throttle.before_batch()
            self.healing.current_batch = batch  # what evolve_schema / quarantine_input / shrink_batch look at
            faults.inject("batch", self, df=batch.df)  # no-op unless LAKEHOUSE_FAULTS is set
            res = session.write(batch)
            outcome.writes.append(res)
            outcome.rows_written += res.rows_written
            self.log.info("%s: commit %d (%s) wrote %d rows (%d so far) to branch %s",
                          self.target.identifier, i + 1, batch.label, res.rows_written, outcome.rows_written, branch)
            written = int(res.summary.get("added-files-size", 0) or 0)
            throttle.after_batch(res.rows_written, sum(f.size for f in batch.files) or written, written)
        if throttle.active:  # how long rate limits held this stage back (materialization metadata)
            outcome.extra["throttle_wait_s"] = round(throttle.waited_s, 3)
        outcome.quarantined_rows = session.quarantined_rows
        if not session.created:
            outcome.skipped_reason = "no readable input"
            outcome.published = True
            outcome.duration_s = time.monotonic() - t0
            return outcome
        outcome.checks = session.audit()
        self._record_checks(outcome.checks)
        failures = [c for c in outcome.checks if c.blocking_failure]
        if failures:
            names = ", ".join(c.rule.name for c in failures)
            self.audit("audit_failed", outcome="not_published", message=names, details={"branch": branch})
            from lakehouse.branches import keep_failed_audit

            keep_failed_audit(self.platform, session.branch_tables(), branch, self.run_id, f"failed rule(s) {names}")
            outcome.duration_s = time.monotonic() - t0
            from lakehouse.lineage.datahub import emit_stage_run

            emit_stage_run(self, None, outcome, success=False)  # the failed run and its assertions
            why = "; ".join(f"{c.rule.name}: {c.message}" for c in failures if c.message)
            failed = AuditFailed(
                f"{self.target.identifier} (stage {self.stage.pipeline_id}.{self.stage.stage_name}) failed "
                f"blocking rule(s) {names}" + (f" ({why})" if why else "") + ": main is unchanged, "
                f"the data is kept on branch {branch!r}. "
                f"Inspect it with `lakehouse branches show {self.target.identifier} {branch}`, fix the input "
                "or the rule, then re-run the stage.",
                outcome.checks, branch,
            )
            from lakehouse import alerts

            alerts.audit_failed(self, failed)  # never raises: an alert channel that is down fails nothing
            raise failed
        from lakehouse.control.healing import run_with_healing

        def publish() -> int | None:
            self.require_enabled("before publish")  # re-checked on every healing retry too
            faults.inject("publish", self)
            return session.publish()

        # a commit conflict here is healed by refreshing and publishing again (not rewriting)
        result = run_with_healing(self, "publish", publish)
        if not result.published:
            from lakehouse.publish import Superseded

            raise Superseded(result)  # the caller writes what is left on a fresh branch
        outcome.snapshot_id = result.snapshot_id
        outcome.published = True
        outcome.duration_s = time.monotonic() - t0
        self.audit("published", outcome="success", duration_ms=int(outcome.duration_s * 1000),
                   details={"snapshot_id": outcome.snapshot_id, "rows": outcome.rows_written,
                            "quarantined_rows": outcome.quarantined_rows})
        return outcome

    def _record_checks(self, checks: list[CheckOutcome]) -> None:
        from lakehouse.validation.history import record_outcomes

        record_outcomes(self, checks)

    def _after_publish(self, plan: ExtractPlan, outcome: StageOutcome) -> None:
        if plan.kind in ("files", "s3"):
            from lakehouse.ingest.checkpoints import record_published

            record_published(self, outcome, plan)
        if plan.kind == "jdbc":
            from lakehouse.ingest.jdbc import after_publish

            after_publish(self, plan, outcome)  # rows read / watermark into metadata; drop the staged copy
        if self.target.export_target_id:
            from lakehouse.export.warehouse import export_after_publish

            export_after_publish(self, outcome)  # adds rows/table/duration to outcome.extra
        from lakehouse.lineage.datahub import emit_stage_run

        emit_stage_run(self, plan, outcome, success=True)  # lineage + run to DataHub; never raises


def _json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"), default=str)
