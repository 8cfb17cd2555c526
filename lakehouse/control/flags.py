"""Source and target kill switches: `control_flags` rows with entity_type `source` / `target`.

A pipeline or stage flag stops a run: its steps skip with the reason (a kill switch is not a failure),
the stages downstream of a disabled stage in its pipeline skip with it, and `lakehouse run` of a
disabled pipeline ends before it starts (`pipeline_stopped`: who disabled it, and when). A source or target flag
switches one dataset off for every stage touching it: a disabled source is not read (its extracts
and its arrival sensors skip), a disabled target is not written (the load skips, and a publish
after the flip does not happen). Both are read from the control DB at each check, so a flip applies
in flight: before extract, before load and immediately before publish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from lakehouse.metadata.model import MetadataCatalog
    from lakehouse.metadata.store import MetadataStore


@dataclass(frozen=True)
class DatasetGate:
    ok: bool
    reason: str = "enabled"
    entity_type: str | None = None  # source | target, for the one that is off
    entity_id: str | None = None

    @property
    def enable_command(self) -> str:
        return f"lakehouse {self.entity_type} enable {self.entity_id}" if self.entity_id else ""


def dataset_gate(store: MetadataStore, source_ids: Iterable[str | None] = (), target_id: str | None = None
                 ) -> DatasetGate:
    """Are these sources readable and this target writable right now? One query."""
    from lakehouse.metadata.store import TABLES

    wanted = [("source", s) for s in dict.fromkeys(source_ids) if s] + ([("target", target_id)] if target_id else [])
    if not wanted:
        return DatasetGate(True)
    table, _ = TABLES["control_flags"]
    store.create_all()
    cond = sa.or_(*[sa.and_(table.c.entity_type == t, table.c.entity_id == i) for t, i in wanted])
    with store.engine.connect() as conn:
        off = {(r[0], r[1]) for r in conn.execute(
            sa.select(table.c.entity_type, table.c.entity_id).where(
                cond, table.c.flag_name == "enabled", table.c.flag_value.is_(False)))}
    for kind, ident in wanted:  # sources first: a source that is off says more than its target
        if (kind, ident) in off:
            verb = "read" if kind == "source" else "written"
            return DatasetGate(False, f"{kind} {ident!r} is disabled by control_flags (not {verb} until "
                                      f"re-enabled)", kind, ident)
    return DatasetGate(True)


def stage_datasets(catalog: MetadataCatalog, pipeline_id: str, stage_name: str) -> tuple[list[str], str]:
    """(source ids the stage reads by source_id, its target id)."""
    stage = catalog.stage(pipeline_id, stage_name)
    return ([stage.source_id] if stage.source_id else []), stage.target_id


def stage_enabled(store: MetadataStore, catalog: MetadataCatalog, pipeline_id: str, stage_name: str
                  ) -> tuple[bool, str]:
    """Pipeline/stage/platform flags (MetadataStore.enabled), then the stage's source and target flags."""
    ok, reason = store.enabled(pipeline_id, stage_name)
    if not ok:
        return ok, reason
    try:
        sources, target = stage_datasets(catalog, pipeline_id, stage_name)
    except KeyError as exc:
        return False, str(exc.args[0])
    gate = dataset_gate(store, sources, target)
    return gate.ok, gate.reason


def dataset_status(catalog: MetadataCatalog) -> list[dict]:
    """Every source and target with its effective flag, for `lakehouse control status`."""
    off = {(f.entity_type, f.entity_id) for f in catalog.control_flags if f.flag_name == "enabled" and not f.flag_value}
    rows = []
    for kind, ids in (("source", [s.source_id for s in catalog.sources]),
                      ("target", [t.target_id for t in catalog.targets])):
        for ident in ids:
            disabled = (kind, ident) in off
            rows.append({"entity": kind, "id": ident, "enabled": not disabled,
                         "reason": f"{kind} {ident!r} is disabled by control_flags" if disabled else "enabled"})
    return rows


def enable_command(reason: str, pipeline_id: str, stage_name: str | None = None) -> str:
    """The command that lifts the flag `MetadataStore.enabled`'s reason names."""
    if reason.startswith("the whole platform"):
        return "UPDATE control_flags SET flag_value = true WHERE entity_type = 'platform' AND entity_id = '*'"
    if reason.startswith("stage ") and stage_name:
        return f"lakehouse stage enable {pipeline_id} {stage_name}"
    return f"lakehouse pipeline enable {pipeline_id}"


def _flag_row(conn, table, entity_type: str, entity_id: str):
    return conn.execute(sa.select(table.c.flag_value, table.c.updated_by, table.c.updated_at).where(
        table.c.entity_type == entity_type, table.c.entity_id == entity_id, table.c.flag_name == "enabled")).first()


def _by(row) -> str:
    who = row.updated_by or "control_flags"
    return f"{who} at {row.updated_at:%Y-%m-%d %H:%M:%S} UTC" if row.updated_at else who


def pipeline_stopped(store: MetadataStore, pipeline_id: str) -> str | None:
    """Why a run of this pipeline must not start, with who and when ("pipeline P disabled by cli at
    …"), or None: enabled, or not a pipeline of the control DB (the caller names the known ones).
    A few indexed reads, no Spark: `lakehouse run` asks before anything else."""
    from lakehouse.metadata.store import TABLES

    flags, _ = TABLES["control_flags"]
    pipes, _ = TABLES["pipelines"]
    store.create_all()
    with store.engine.connect() as conn:
        p = conn.execute(sa.select(pipes.c.enabled).where(pipes.c.pipeline_id == pipeline_id)).first()
        if p is None:
            return None
        platform = _flag_row(conn, flags, "platform", "*")
        if platform is not None and not platform.flag_value:
            return (f"pipeline {pipeline_id} disabled with the whole platform by {_by(platform)} "
                    "(control_flags platform/*)")
        row = _flag_row(conn, flags, "pipeline", pipeline_id)
    if row is not None:
        return None if row.flag_value else f"pipeline {pipeline_id} disabled by {_by(row)}"
    return None if p.enabled else f"pipeline {pipeline_id} disabled by its metadata (pipelines.enabled: false)"


def disabled_stages(catalog: MetadataCatalog, pipeline_id: str) -> set[str]:
    """The names of the pipeline's stages a stage flag (or `stages.enabled`) switches off, by the catalog."""
    flags = {f.entity_id: f.flag_value for f in catalog.control_flags
             if f.entity_type == "stage" and f.flag_name == "enabled"}
    return {s.stage_name for s in catalog.stages_of(pipeline_id)
            if not flags.get(f"{pipeline_id}.{s.stage_name}", s.enabled)}


def upstream_disabled(catalog: MetadataCatalog, pipeline_id: str, stage_name: str,
                      tables_read: Callable[[], dict[str, list[str]]]) -> str | None:
    """Why this stage skips with a disabled stage upstream of it in its pipeline (its input would not
    be what the run should have made), or None. `tables_read()` answers {stage_name: the lake tables
    it reads} of the pipeline's stages; it is asked only when a stage of the pipeline is off."""
    off = disabled_stages(catalog, pipeline_id) - {stage_name}
    if not off:
        return None
    stages = catalog.stages_of(pipeline_id)
    producer = {catalog.target(s.target_id).identifier.lower(): s.stage_name for s in stages}
    by_target = {s.target_id: s.stage_name for s in stages}
    tables = tables_read()
    reads = {s.stage_name: {producer[t.lower()] for t in tables.get(s.stage_name, []) if t.lower() in producer}
             | ({by_target[s.source_id]} if s.source_id in by_target else set()) for s in stages}
    seen: set[str] = set()
    todo = sorted(reads.get(stage_name, set()))
    while todo:
        up = todo.pop(0)
        if up in seen:
            continue
        seen.add(up)
        if up in off:
            return (f"upstream stage {pipeline_id}.{up} is disabled by control_flags; this stage is skipped "
                    f"with it. Re-enable with `lakehouse stage enable {pipeline_id} {up}`")
        todo.extend(sorted(reads.get(up, set())))
    return None
