"""The values one stage passes from step to step: request → plan → staged write → publish result.

Each is frozen: a step reads the value it is given and returns a new one, and nothing a later step
needs is left on a shared object. `StageRequest` and `StagePlan` are small; `StagedWrite` is the
reference to a write on its audit branch that the Dagster IO manager stores (`to_json`) and that
is enough to publish it from another process (`lakehouse.stage.steps.publish`).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from lakehouse.stage.core import ExtractPlan, FileRef, HealingState, StageContext, StageOutcome

if TYPE_CHECKING:
    from lakehouse.metadata.model import MetadataCatalog, Target

#: the version of the JSON a StagedWrite is stored as; from_json refuses another one
FORMAT = 1


def _frozen(d: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(d or {}))


#: values JSON lacks that a plan, a report or a check's sample rows hold, kept by type through JSON
_TAGGED = {"datetime": datetime.datetime, "date": datetime.date, "time": datetime.time, "decimal": decimal.Decimal}


def _tag(value: Any) -> Any:
    for tag, kind in _TAGGED.items():
        if type(value) is kind:
            return {"__lakehouse_type__": tag, "value": value.isoformat() if tag != "decimal" else str(value)}
    return str(value)  # anything else JSON lacks: as text


def _untag(d: dict) -> Any:
    tag = d.get("__lakehouse_type__")
    if tag is None or set(d) != {"__lakehouse_type__", "value"}:
        return d
    kind = _TAGGED[tag]
    return kind(d["value"]) if tag == "decimal" else kind.fromisoformat(d["value"])


def to_json_text(value: Any) -> str:
    """`value` as JSON text; dates, times and decimals are tagged so `from_json_text` restores them."""
    return json.dumps(value, default=_tag, sort_keys=True)


def from_json_text(text: str) -> Any:
    return json.loads(text, object_hook=_untag)


def plain(value: Any) -> Any:
    """A deep copy of `value` through JSON (mappings and sequences copied; dates, times and decimals
    kept; anything else JSON lacks as text)."""
    return from_json_text(to_json_text(value))


@dataclass(frozen=True)
class StageRequest:
    """What is asked: one stage of one pipeline in one run, and what the run fixed for it.

    `metadata_version`: a fingerprint of the metadata rows the stage runs by (its pipeline, stage,
    target and rule set) when the request was made, so a stored request says which metadata it
    meant; `pins`: upstream tables' snapshots the run fixed ((table, snapshot id) pairs);
    `run_tags`: the run's tags (e.g. the arrival sensor's lakehouse/arrival_batch)."""

    pipeline_id: str
    stage_name: str
    run_id: str
    metadata_version: str | None = None
    pins: tuple[tuple[str, int | None], ...] = ()
    run_tags: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, ctx: StageContext, pins: Mapping[str, int | None] | None = None) -> StageRequest:
        """The request a context was built for."""
        return cls(ctx.stage.pipeline_id, ctx.stage.stage_name, ctx.run_id,
                   metadata_version(ctx.catalog, ctx.stage.pipeline_id, ctx.stage.stage_name)
                   if ctx.described_by_metadata else None,
                   tuple(sorted((pins or {}).items())), tuple(sorted(ctx.run_tags.items())))

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "stage_name": self.stage_name, "run_id": self.run_id,
                "metadata_version": self.metadata_version, "pins": [list(p) for p in self.pins],
                "run_tags": dict(self.run_tags)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StageRequest:
        return cls(d["pipeline_id"], d["stage_name"], d["run_id"], d.get("metadata_version"),
                   tuple((str(t), s) for t, s in d.get("pins") or ()),
                   tuple(sorted((str(k), str(v)) for k, v in (d.get("run_tags") or {}).items())))


def metadata_version(catalog: MetadataCatalog, pipeline_id: str, stage_name: str) -> str | None:
    """A short fingerprint of the metadata rows one stage runs by (None: the stage is not in it)."""
    try:
        stage = catalog.stage(pipeline_id, stage_name)
        rows = [catalog.pipeline(pipeline_id), stage, catalog.target(stage.target_id)]
        if stage.validation_set_id:
            rows.append(catalog.rule_set(stage.validation_set_id))
    except KeyError:
        return None
    text = "\n".join(r.model_dump_json() for r in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StagePlan:
    """What the write step will read (today's `lakehouse.stage.core.ExtractPlan`, frozen). The source
    adapters fill a mutable ExtractPlan while they plan; `of` freezes it and `extract_plan` gives
    a fresh mutable copy to the code that still takes one."""

    pipeline_id: str
    stage_name: str
    kind: str
    files: tuple[FileRef, ...] = ()
    upstream_snapshots: Mapping[str, int | None] = field(default_factory=lambda: _frozen({}))
    staged_path: str | None = None
    details: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    skipped_reason: str | None = None
    source_id: str | None = None
    main_at_plan: int | None = None

    def __post_init__(self) -> None:  # read-only, whatever mapping or sequence the caller gave
        object.__setattr__(self, "files", tuple(self.files))
        for name in ("upstream_snapshots", "details"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @classmethod
    def of(cls, plan: ExtractPlan) -> StagePlan:
        return cls(plan.pipeline_id, plan.stage_name, plan.kind, tuple(plan.files),
                   _frozen(plan.upstream_snapshots), plan.staged_path, _frozen(plain(plan.details)),
                   plan.skipped_reason, plan.source_id, plan.main_at_plan)

    def extract_plan(self) -> ExtractPlan:
        return ExtractPlan(self.pipeline_id, self.stage_name, self.kind, list(self.files),
                           dict(self.upstream_snapshots), self.staged_path, plain(dict(self.details)),
                           self.skipped_reason, self.source_id, self.main_at_plan)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline_id": self.pipeline_id, "stage_name": self.stage_name, "kind": self.kind,
                "files": [dataclasses.asdict(f) for f in self.files],
                "upstream_snapshots": dict(self.upstream_snapshots), "staged_path": self.staged_path,
                "details": plain(dict(self.details)), "skipped_reason": self.skipped_reason,
                "source_id": self.source_id, "main_at_plan": self.main_at_plan}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StagePlan:
        return cls(d["pipeline_id"], d["stage_name"], d["kind"], tuple(FileRef(**f) for f in d.get("files") or ()),
                   _frozen(d.get("upstream_snapshots")), d.get("staged_path"), _frozen(d.get("details")),
                   d.get("skipped_reason"), d.get("source_id"), d.get("main_at_plan"))


# --------------------------------------------------------------------------- the outcome as JSON

def outcome_to_dict(outcome: StageOutcome) -> dict[str, Any]:
    """A StageOutcome as JSON takes it; its target is named by id (the metadata holds it)."""
    d = {f.name: getattr(outcome, f.name) for f in dataclasses.fields(outcome) if f.name not in ("target", "writes",
                                                                                                  "checks")}
    d["target_id"] = outcome.target.target_id
    d["writes"] = [dataclasses.asdict(w) for w in outcome.writes]
    d["checks"] = [{**{f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "rule"},
                    "rule": c.rule.model_dump(mode="json")} for c in outcome.checks]
    return plain(d)


def outcome_from_dict(d: Mapping[str, Any], target: Target) -> StageOutcome:
    from lakehouse.metadata.model import Rule
    from lakehouse.table.iceberg import WriteResult
    from lakehouse.validation.rules import CheckOutcome

    fields = {k: v for k, v in d.items() if k not in ("target_id", "writes", "checks")}
    outcome = StageOutcome(target=target, **fields)
    outcome.writes = [WriteResult(**w) for w in d.get("writes") or ()]
    outcome.checks = [CheckOutcome(**{**c, "rule": Rule.model_validate(c["rule"])}) for c in d.get("checks") or ()]
    return outcome


def healing_to_dict(state: HealingState) -> dict[str, Any]:
    return plain({"batch_scale": state.batch_scale, "quarantined_files": state.quarantined_files,
                   "skipped_files": state.skipped_files, "attempts": dict(state.attempts),
                   "total_attempts": state.total_attempts, "events": state.events})


def healing_from_dict(d: Mapping[str, Any]) -> HealingState:
    from collections import Counter

    return HealingState(batch_scale=float(d.get("batch_scale", 1.0)),
                        quarantined_files=dict(d.get("quarantined_files") or {}),
                        skipped_files=dict(d.get("skipped_files") or {}), attempts=Counter(d.get("attempts") or {}),
                        total_attempts=int(d.get("total_attempts", 0)), events=list(d.get("events") or ()))


@dataclass(frozen=True)
class StagedWrite:
    """A stage's write on its audit branch, audited, awaiting its publish: a reference to it, and
    enough to publish it from anywhere (`lakehouse.stage.steps.publish`).

    `table`/`branch`: the target and this run's audit branch on it; `since`: main when the input was
    planned (the publish checks what other runs committed after it); `staged_snapshot_id`: the
    branch's head; `can_rebase`: an append the publish may replay onto a moved main; `quarantine`:
    (quarantine table, its main when this run forked its branch) when rows were quarantined;
    `engine`: the engine that wrote it (it writes a remainder too). `publishes` False: nothing to
    publish (skipped, nothing new, identical to main: `outcome` says why). `outcome`: the counts and
    check outcomes so far (`outcome_to_dict`); `healing`/`report`: what healing changed in this step
    and what the read reported (files kept out of the table, schema changes, the SQL engine), both
    reported with the publish; `started_at`: the
    wall-clock start of the step (its duration runs to the publish)."""

    request: StageRequest
    plan: StagePlan
    table: str
    branch: str
    engine: str = "spark"
    publishes: bool = False
    since: int | None = None
    staged_snapshot_id: int | None = None
    can_rebase: bool = False
    quarantine: tuple[str, int | None] | None = None
    outcome: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    healing: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    report: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    started_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:  # read-only, whatever mapping or sequence the caller gave
        if self.quarantine is not None:
            object.__setattr__(self, "quarantine", tuple(self.quarantine))
        for name in ("outcome", "healing", "report"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    @property
    def run_id(self) -> str:
        return self.request.run_id

    def counts(self) -> dict[str, int]:
        """The logical and physical row counts of the write so far."""
        keys = ("rows_read", "rows_in", "rows_inserted", "rows_updated", "rows_deleted", "rows_written",
                "quarantined_rows", "rows_rewritten", "physical_rows_deleted")
        return {k: int(self.outcome.get(k, 0) or 0) for k in keys if k in self.outcome}

    def to_json(self) -> str:
        return to_json_text({
            "format": FORMAT, "request": self.request.to_dict(), "plan": self.plan.to_dict(), "table": self.table,
            "branch": self.branch, "engine": self.engine, "publishes": self.publishes, "since": self.since,
            "staged_snapshot_id": self.staged_snapshot_id, "can_rebase": self.can_rebase,
            "quarantine": list(self.quarantine) if self.quarantine else None, "outcome": plain(dict(self.outcome)),
            "healing": plain(dict(self.healing)), "report": plain(dict(self.report)),
            "started_at": self.started_at})

    @classmethod
    def from_json(cls, text: str) -> StagedWrite:
        d = from_json_text(text)
        if d.get("format") != FORMAT:
            raise ValueError(f"a staged-write reference of format {d.get('format')!r}; this code reads format {FORMAT}")
        q = d.get("quarantine")
        return cls(StageRequest.from_dict(d["request"]), StagePlan.from_dict(d["plan"]), d["table"], d["branch"],
                   d.get("engine", "spark"), bool(d.get("publishes")), d.get("since"), d.get("staged_snapshot_id"),
                   bool(d.get("can_rebase")), (q[0], q[1]) if q else None, _frozen(d.get("outcome")),
                   _frozen(d.get("healing")), _frozen(d.get("report")), float(d["started_at"]))


@dataclass(frozen=True)
class PublishResult:
    """What the publish did: the table, whether the write is on main (or the step was skipped, and
    why), main's snapshot after it, and the stage's final outcome (its materialization metadata,
    check outcomes and commits)."""

    table: str
    published: bool
    snapshot_id: int | None
    skipped_reason: str | None
    outcome: StageOutcome = field(compare=False, repr=False)

    @classmethod
    def of(cls, outcome: StageOutcome) -> PublishResult:
        return cls(outcome.target.identifier, outcome.published, outcome.snapshot_id, outcome.skipped_reason, outcome)

    def metadata(self) -> dict[str, Any]:
        return self.outcome.metadata()
