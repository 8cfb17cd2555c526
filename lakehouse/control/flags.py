"""Source and target kill switches: `control_flags` rows with entity_type `source` / `target`.

A pipeline or stage flag *stops* a run (the step fails with the reason). A source or target flag
switches one dataset off for every stage touching it: a disabled source is not read (its extracts
and its arrival sensors skip), a disabled target is not written (the load skips, and a publish
after the flip does not happen). Both are read from the control DB at each check, so a flip applies
in flight: before extract, before load and immediately before publish.
"""

from __future__ import annotations

from collections.abc import Iterable
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
