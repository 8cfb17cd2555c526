"""Rerouting an extraction over the lineage graph when what it reads is down.

Probes and "is this error the source being unavailable" are the source adapters'
(lakehouse.sources); this module chooses the route. See docs/lineage.md ("Recovery API").
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.errors import SourceUnavailable
from lakehouse.lineage.graph import (
    Route,
    candidate_routes,
    choose,
    edges_into,
    mark_availability,
    replicas,
    stage_upstreams,
    sync,
)
from lakehouse.metadata.model import MetadataCatalog, Source
from lakehouse.sources import adapter_for
from lakehouse.sources.iceberg import probe_table
from lakehouse.sources.jdbc import probe_jdbc
from lakehouse.stage.core import NoRecoveryPath, StageContext, resolve_source

if TYPE_CHECKING:
    from collections.abc import Callable

    from lakehouse.platform import Platform

__all__ = ["NoRecoveryPath", "Reroute", "SourceUnavailable", "extract_with_recovery", "probe_dataset",
           "probe_source", "probe_table", "reroute", "resolve_source", "route_report", "sql_table_overrides"]

log = logging.getLogger(__name__)


@dataclass
class Reroute:
    dataset_id: str
    from_dataset_id: str | None
    to_dataset_id: str
    path: list[str]
    cost: float
    reason: str = ""
    considered: list[dict[str, Any]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.from_dataset_id != self.to_dataset_id


# --------------------------------------------------------------------------- probes


def probe_source(platform: Platform, src: Source) -> tuple[bool, str]:
    """(available, why): the source adapter's cheap check that the source can be read now."""
    try:
        return adapter_for(src.kind).probe(platform, src)
    except Exception as exc:  # a probe reports, it never raises
        return False, f"{type(exc).__name__}: {exc}"


def probe_dataset(platform: Platform, catalog: MetadataCatalog, dataset_id: str) -> tuple[bool, str]:
    src = next((s for s in catalog.sources if s.source_id == dataset_id), None)
    if src is not None:
        return probe_source(platform, src)
    tgt = next((t for t in catalog.targets if t.target_id == dataset_id), None)
    if tgt is None:
        return False, f"unknown dataset {dataset_id!r}"
    if tgt.kind == "iceberg":
        return probe_table(platform, tgt.identifier)
    try:  # a warehouse target: one connection to its database
        return probe_jdbc(platform, tgt)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- routes


def route_report(platform: Platform, dataset_id: str, catalog: MetadataCatalog | None = None,
                 unavailable: dict[str, str] | None = None) -> tuple[list[Route], Route | None]:
    """Every route into `dataset_id` (the graph's and the operator's recovery paths) with
    availability, and the one that would be used now."""
    catalog = catalog or platform.catalog()
    rs = candidate_routes(catalog, dataset_id)
    mark_availability(rs, lambda ds: probe_dataset(platform, catalog, ds), unavailable)
    return rs, choose(rs)


def reroute(platform: Platform, dataset_id: str, *, ctx: StageContext | None = None, failed: str | None = None,
            error: BaseException | None = None, run_id: str | None = None,
            accept: Callable[[Route], bool] | None = None, point_runner: bool = True) -> Reroute:
    """Pick the cheapest available route into `dataset_id` (that `accept` allows), record it, and
    point the stage `ctx` at it (its source_override) unless `point_runner` is false."""
    runner = ctx
    catalog = runner.catalog if runner else platform.catalog()
    run_id = run_id or (runner.run_id if runner else None)
    current = None
    if runner is not None:
        current = runner.source_override or runner.stage.source_id
    failed = failed or current
    why = f"{type(error).__name__}: {error}" if error is not None else "reported unavailable"
    rs, _ = route_report(platform, dataset_id, catalog, {failed: why} if failed else None)
    chosen = next((r for r in rs if r.available and resolve_source(catalog, r.upstream or "") is not None
                   and (accept is None or accept(r))), None)
    considered = [{"path": r.path, "cost": r.cost, "default": r.is_default, "unavailable": r.unavailable}
                  for r in rs]
    audit = {"run_id": run_id, "dataset": dataset_id, "event": "reroute", "action": "switch_to_recovery_path",
             "error_class": type(error).__name__ if error is not None else None}
    if runner is not None:
        audit.update(pipeline_id=runner.stage.pipeline_id, stage_name=runner.stage.stage_name)
    if chosen is None:
        lines = "; ".join(f"{r.as_text()} (cost {r.cost:g}): " + ", ".join(f"{k} {v}" for k, v in r.unavailable.items())
                          for r in rs) or "no routes at all"
        msg = f"no available route into {dataset_id!r} ({failed!r} is unavailable: {why}). Routes: {lines}"
        platform.store.audit(**audit, outcome="no_route", message=msg,
                             details={"from": failed, "considered": considered})
        raise NoRecoveryPath(msg, rs)
    decision = Reroute(dataset_id, current or failed, chosen.upstream, chosen.path, chosen.cost,
                       reason=why, considered=considered)
    msg = (f"{dataset_id}: {failed} unavailable ({why}); rerouted to {chosen.upstream} "
           f"via {chosen.as_text()} (cost {chosen.cost:g})")
    platform.store.audit(**audit, outcome="rerouted", message=msg,
                         details={"from": decision.from_dataset_id, "to": decision.to_dataset_id,
                                  "path": chosen.path, "cost": chosen.cost, "considered": considered})
    log.warning(msg)
    if runner is not None and point_runner:
        runner.source_override = chosen.upstream
    try:
        sync(platform.store, catalog)
    except Exception:  # keeping the derived tables fresh must never block a recovery
        log.exception("could not refresh dataset_recovery_paths")
    return decision


def active_reroute(platform: Platform, run_id: str | None, dataset_id: str) -> Reroute | None:
    """The reroute already decided for this dataset in this run (retries and the load op reuse it)."""
    if not run_id:
        return None
    for e in reversed(platform.store.audit_entries(run_id=run_id, event="reroute")):
        if e.dataset == dataset_id and e.outcome == "rerouted":
            d = e.details
            return Reroute(dataset_id, d.get("from"), d["to"], d.get("path", []), float(d.get("cost", 0)),
                           reason=e.message or "")
    return None


def has_alternative(catalog: MetadataCatalog, dataset_id: str, current: str | None) -> bool:
    """Is there a route into `dataset_id` other than from `current`? (Asked by every extract: only
    the edges into it are derived, not the whole graph.)"""
    return any(e.from_dataset_id != current for e in edges_into(catalog, dataset_id))


def sql_table_overrides(runner: StageContext) -> dict[str, str]:
    """For a SQL stage: each upstream table that is unavailable, swapped for the cheapest available
    replacement. A replacement is the table's declared replica (`alternative_source_id` of its
    target), or, for a stage with a single upstream, the upstream of any other route into the
    stage's target (an explicit dataset_lineage row or an operator's recovery path); it must be an
    Iceberg table. Returns {identifier in the SQL: replacement identifier}; raises NoRecoveryPath
    when an unavailable table has no replacement. Stages with no other route are never probed."""
    catalog, st = runner.catalog, runner.stage
    derived = runner.stored_derivation()  # what apply stored: no SQL parsed
    ups = [u for u in stage_upstreams(catalog, st, derived.get((st.pipeline_id, st.stage_name)))
           if any(t.target_id == u for t in catalog.targets)]
    # the edges into this stage's target only: deriving the whole graph parsed every pipeline's SQL
    # in every run (issue 22: 40 s of a one-pipeline run at 1,000 pipelines)
    others = {e.from_dataset_id for e in edges_into(catalog, st.target_id, derived) if e.from_dataset_id not in ups}
    others |= {p.path_sequence[-2] for p in catalog.dataset_recovery_paths
               if p.dataset_id == st.target_id and not p.derived}
    if not ups or not (others - set(ups)):
        return {}
    reps = replicas(catalog)
    overrides: dict[str, str] = {}
    for up in ups:
        ident = catalog.target(up).identifier
        ok, why = probe_table(runner.platform, ident)
        if ok:
            continue

        def replaces(route: Route, up=up) -> bool:
            src = resolve_source(catalog, route.upstream or "")
            return (route.upstream not in ups and src is not None and src.kind == "iceberg"
                    and (route.upstream == reps.get(up) or len(ups) == 1))

        decision = reroute(runner.platform, st.target_id, ctx=runner, failed=up, error=SourceUnavailable(why),
                           accept=replaces, point_runner=False)
        overrides[ident.lower()] = resolve_source(catalog, decision.to_dataset_id).table_identifier
    return overrides


def extract_with_recovery(runner: StageContext, plan: Callable[[], Any]) -> Any:
    """Run the extract planning, rerouting first when the default upstream is down.

    A stage that reads a source and has another route reads the chosen upstream instead; a SQL
    stage has each unavailable upstream table swapped for its replacement (`sql_table_overrides`).
    Without an alternative the stage behaves exactly as before (same errors, same skips).
    """
    st = runner.stage
    if st.transformation:
        runner.table_overrides = sql_table_overrides(runner)
        out = plan()
        if runner.table_overrides:
            out.details["table_overrides"] = dict(runner.table_overrides)  # the load op reads the same tables
        return out
    if not st.source_id:
        return plan()
    active = active_reroute(runner.platform, runner.run_id, st.target_id)
    if active is not None:
        runner.source_override = active.to_dataset_id
        return plan()
    current = st.source_id
    if not has_alternative(runner.catalog, st.target_id, current):
        return plan()
    src = runner.source
    if src is not None:
        ok, why = probe_source(runner.platform, src)
        if not ok:
            reroute(runner.platform, st.target_id, ctx=runner, failed=current, error=SourceUnavailable(why))
            return plan()
    try:
        return plan()
    except Exception as exc:
        if not adapter_for(runner.source_kind).is_unavailable(exc):
            raise
        reroute(runner.platform, st.target_id, ctx=runner, failed=runner.source_override or current, error=exc)
        return plan()


def reroute_dict(r: Reroute) -> dict[str, Any]:
    return asdict(r)
