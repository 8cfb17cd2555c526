"""The dataset lineage graph (networkx): every route a dataset can be produced from, with costs.

Edges come from three places, later ones overriding earlier ones with the same
(from, to) key:
  1. the stages themselves (source_id → target, and every table the stage's SQL reads →
     target), default routes of cost 1 with the SQL's column lineage attached;
  2. `alternative_source_id` of a source or of a target (a declared replica of a table): the
     replica feeds whatever the primary feeds, at the primary edge's cost + 1, not a default route;
  3. explicit `dataset_lineage` rows (an operator's costs and extra routes always win).
Derived rows are written back to `dataset_lineage` (transform_name `stage:` / `alternative:`)
so the table holds every route, and the derived rows of `dataset_recovery_paths` are recomputed
from the graph. An operator's `dataset_recovery_paths` rows (derived: false) are kept as written
and are routes too (`candidate_routes`): with a lower cost they win over the derived ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

import sqlalchemy as sa

from lakehouse.metadata.derive import StageDerivation
from lakehouse.metadata.model import DatasetLineage, DatasetRecoveryPath, MetadataCatalog, Stage

if TYPE_CHECKING:  # networkx is imported where a graph is built: a stage run asks only for edges (~0.3 s)
    import networkx as nx

STAGE_PREFIX = "stage:"
ALT_PREFIX = "alternative:"
_ROOT = "\x00root"
MAX_ROUTES = 200


def stage_upstreams(catalog: MetadataCatalog, stage: Stage, derived: StageDerivation | None = None) -> list[str]:
    """Dataset ids a stage reads: its source_id and the targets behind the tables in its SQL (from
    what apply derived, when given: then no SQL is parsed)."""
    ups: list[str] = []
    if stage.transformation:
        if derived is not None:
            idents = derived.upstream_tables
        else:
            from lakehouse.sql.parse import tables_in_sql

            idents = tables_in_sql(stage.transformation)
        for ident in idents:
            t = catalog.target_by_identifier(ident)
            if t is not None:
                ups.append(t.target_id)
    if stage.source_id:
        ups.append(stage.source_id)
    return list(dict.fromkeys(ups))


def stage_column_lineage(catalog: MetadataCatalog, stage: Stage,
                         derived: StageDerivation | None = None) -> dict[str, dict[str, list[str]]]:
    """{upstream dataset id: {column: [upstream columns]}} of a SQL stage ({} when not derivable)."""
    if not stage.transformation:
        return {}
    from lakehouse.lineage.columns import ColumnLineage, column_lineage
    from lakehouse.sql.parse import SqlParseError

    if derived is not None:
        per_table = ColumnLineage({c: [(t, s) for t, s in pairs] for c, pairs in derived.column_lineage.items()}
                                  ).by_upstream()
    else:
        try:
            per_table = column_lineage(stage.transformation).by_upstream()
        except SqlParseError:
            return {}
    out = {}
    for ident, cols in per_table.items():
        t = catalog.target_by_identifier(ident)
        if t is not None:
            out[t.target_id] = cols
    return out


#: (pipeline_id, stage_name) -> what apply derived for the stage (lakehouse.metadata.derived)
Derived = Mapping[tuple[str, str], StageDerivation]


def derived_edges(catalog: MetadataCatalog, stages: Iterable[Stage] | None = None,
                  derived: Derived | None = None) -> list[DatasetLineage]:
    """The lineage the stages (all, or `stages`) and alternative sources imply (before explicit rows override)."""
    return list(_derived_edges(catalog, catalog.stages if stages is None else stages, derived or {}).values())


def _derived_edges(catalog: MetadataCatalog, stages: Iterable[Stage],
                   derived: Derived) -> dict[tuple[str, str], DatasetLineage]:
    edges: dict[tuple[str, str], DatasetLineage] = {}
    for st in stages:
        d = derived.get((st.pipeline_id, st.stage_name))
        cols = stage_column_lineage(catalog, st, d)
        for up in stage_upstreams(catalog, st, d):
            edges[(up, st.target_id)] = DatasetLineage(
                from_dataset_id=up, to_dataset_id=st.target_id,
                transform_name=f"{STAGE_PREFIX}{st.pipeline_id}.{st.stage_name}", cost=1.0, is_default=True,
                transformation_sql=st.transformation, column_lineage=cols.get(up, {}),
            )
    explicit = {(e.from_dataset_id, e.to_dataset_id): e for e in catalog.dataset_lineage}
    for primary_id, alt in replicas(catalog).items():
        for (frm, to), e in list(edges.items()):
            if frm != primary_id or (alt, to) in edges:
                continue
            primary = explicit.get((frm, to), e)
            edges[(alt, to)] = DatasetLineage(
                from_dataset_id=alt, to_dataset_id=to, transform_name=f"{ALT_PREFIX}{primary_id}",
                cost=primary.cost + 1.0, is_default=False, transformation_sql=e.transformation_sql,
                column_lineage=e.column_lineage,
            )
    return edges


def replicas(catalog: MetadataCatalog) -> dict[str, str]:
    """dataset id -> its declared replica (`alternative_source_id` of a source or of a target)."""
    out = {s.source_id: s.alternative_source_id for s in catalog.sources if s.alternative_source_id}
    out.update({t.target_id: t.alternative_source_id for t in catalog.targets if t.alternative_source_id})
    return out


_EDGE_CACHE: dict[int, tuple[MetadataCatalog, list[DatasetLineage]]] = {}


def all_edges(catalog: MetadataCatalog, derived: Derived | None = None) -> list[DatasetLineage]:
    """Derived edges overridden by explicit dataset_lineage rows, minus stale derived rows.

    Memoised per catalog object (a catalog is loaded per step and not mutated): parsing every
    stage's SQL once per step, not once per question asked about it. A question about one dataset
    is `edges_into`, which parses only the SQL of the stage writing it.
    """
    hit = _EDGE_CACHE.get(id(catalog))
    if hit is not None and hit[0] is catalog:
        return hit[1]
    edges = _merge(_derived_edges(catalog, catalog.stages, derived or {}), catalog.dataset_lineage)
    if len(_EDGE_CACHE) > 16:
        _EDGE_CACHE.clear()
    _EDGE_CACHE[id(catalog)] = (catalog, edges)
    return edges


def edges_into(catalog: MetadataCatalog, dataset_id: str, derived: Derived | None = None) -> list[DatasetLineage]:
    """`[e for e in all_edges(catalog) if e.to_dataset_id == dataset_id]`, deriving only the stage that
    writes `dataset_id`: what a stage's run asks about itself, at a cost that does not grow with the
    number of pipelines. With that stage's row in `derived` (`StageContext.stored_derivation`), no SQL is parsed."""
    writer = catalog.stage_for_target(dataset_id)
    edges = _derived_edges(catalog, [writer] if writer is not None else [], derived or {})
    return _merge(edges, [e for e in catalog.dataset_lineage if e.to_dataset_id == dataset_id])


def _merge(derived: dict[tuple[str, str], DatasetLineage], explicit: Iterable[DatasetLineage]) -> list[DatasetLineage]:
    out = dict(derived)
    for e in explicit:
        k = (e.from_dataset_id, e.to_dataset_id)
        if _is_derived(e) and k not in derived:
            continue  # a stage/alternative that no longer exists
        if _is_derived(e) and k in derived:
            # keep an operator's cost / default flag, refresh SQL and column lineage from the stage
            out[k] = derived[k].model_copy(update={"cost": e.cost, "is_default": e.is_default})
        elif k in derived and not e.column_lineage:
            out[k] = e.model_copy(update={"column_lineage": derived[k].column_lineage,
                                          "transformation_sql": e.transformation_sql or derived[k].transformation_sql})
        else:
            out[k] = e
    return list(out.values())


def _is_derived(e: DatasetLineage) -> bool:
    return e.transform_name.startswith((STAGE_PREFIX, ALT_PREFIX))


def build_graph(catalog: MetadataCatalog) -> nx.DiGraph:
    import networkx as nx

    g = nx.DiGraph()
    for s in catalog.sources:
        g.add_node(s.source_id, kind="source", source_kind=s.kind)
    for t in catalog.targets:
        g.add_node(t.target_id, kind="target", target_kind=t.kind)
    for e in all_edges(catalog):
        for n in (e.from_dataset_id, e.to_dataset_id):
            if n not in g:
                g.add_node(n, kind="unknown")
        g.add_edge(e.from_dataset_id, e.to_dataset_id, cost=float(e.cost), is_default=e.is_default,
                   transform_name=e.transform_name, lineage=e)
    return g


@dataclass
class Route:
    path: list[str]
    cost: float
    is_default: bool
    unavailable: dict[str, str] = field(default_factory=dict)  # dataset -> why
    operator: bool = False  # an operator's dataset_recovery_paths row, not derived from the graph

    @property
    def available(self) -> bool:
        return not self.unavailable

    @property
    def upstream(self) -> str | None:
        """The dataset the last hop reads: what the producing stage must extract from."""
        return self.path[-2] if len(self.path) > 1 else None

    def as_text(self) -> str:
        return " -> ".join(self.path)


def routes(graph: nx.DiGraph, dataset_id: str, limit: int = MAX_ROUTES) -> list[Route]:
    """Every simple route from an origin (a dataset nothing feeds) to `dataset_id`, cheapest first.

    A virtual root joined to every origin lets networkx's Yen enumeration
    (`shortest_simple_paths`) produce them lazily in cost order, so a wide graph costs `limit`
    paths, not all of them.
    """
    if dataset_id not in graph:
        raise KeyError(f"unknown dataset {dataset_id!r}; known: {sorted(graph.nodes)}")
    import networkx as nx

    anc = nx.ancestors(graph, dataset_id)
    if not anc:
        return []
    sub = graph.subgraph(anc | {dataset_id}).copy()
    origins = [n for n in sub.nodes if sub.in_degree(n) == 0]
    for o in origins:
        sub.add_edge(_ROOT, o, cost=0.0, is_default=True)
    if not origins:  # only cycles feed it: start anywhere upstream
        for n in anc:
            sub.add_edge(_ROOT, n, cost=0.0, is_default=True)
    out = []
    for p in islice(nx.shortest_simple_paths(sub, _ROOT, dataset_id, weight="cost"), limit):
        path = p[1:]
        hops = list(zip(path, path[1:], strict=False))
        out.append(Route(path, sum(graph.edges[h]["cost"] for h in hops),
                         all(graph.edges[h]["is_default"] for h in hops)))
    out.sort(key=lambda r: (r.cost, not r.is_default, len(r.path)))
    return out


def operator_paths(catalog: MetadataCatalog, dataset_id: str | None = None) -> list[DatasetRecoveryPath]:
    return [p for p in catalog.dataset_recovery_paths if not p.derived
            and (dataset_id is None or p.dataset_id == dataset_id)]


def candidate_routes(catalog: MetadataCatalog, dataset_id: str, limit: int = MAX_ROUTES) -> list[Route]:
    """The graph's routes into `dataset_id` plus the operator's recovery paths for it, cheapest
    first. An operator row for a path the graph also has sets that route's cost."""
    graph = build_graph(catalog)
    by_path = {tuple(r.path): r for r in routes(graph, dataset_id, limit)}
    for p in operator_paths(catalog, dataset_id):
        hit = by_path.get(tuple(p.path_sequence))
        if hit is not None:
            hit.cost, hit.operator = float(p.cost), True
        else:
            by_path[tuple(p.path_sequence)] = Route(list(p.path_sequence), float(p.cost), False, operator=True)
    out = list(by_path.values())
    out.sort(key=lambda r: (r.cost, not r.is_default, len(r.path)))
    return out


Probe = Callable[[str], tuple[bool, str]]


def mark_availability(rs: Iterable[Route], probe: Probe, unavailable: dict[str, str] | None = None) -> list[Route]:
    """Fill Route.unavailable with every dataset on the route (but its end) that is down."""
    cache: dict[str, tuple[bool, str]] = {k: (False, v) for k, v in (unavailable or {}).items()}
    out = []
    for r in rs:
        r.unavailable = {}
        for ds in r.path[:-1]:
            if ds not in cache:
                cache[ds] = probe(ds)
            ok, why = cache[ds]
            if not ok:
                r.unavailable[ds] = why
        out.append(r)
    return out


def choose(rs: list[Route]) -> Route | None:
    """The default route while it is available, else the cheapest available one."""
    for r in rs:
        if r.is_default and r.available:
            return r
    return next((r for r in rs if r.available), None)


def recovery_paths(graph: nx.DiGraph, operator: list[DatasetRecoveryPath] = ()) -> list[DatasetRecoveryPath]:
    """Derived rows: every graph route per dataset, numbered after the operator's rows for it (whose
    path_order they never take) and skipping a path an operator row already holds."""
    taken: dict[str, set[int]] = {}
    held: set[tuple[str, tuple[str, ...]]] = set()
    for p in operator:
        taken.setdefault(p.dataset_id, set()).add(p.path_order)
        held.add((p.dataset_id, tuple(p.path_sequence)))
    rows = []
    for ds in sorted(graph.nodes):
        order = max(taken.get(ds, {0}))
        for r in routes(graph, ds):
            if (ds, tuple(r.path)) in held:
                continue
            order += 1
            rows.append(DatasetRecoveryPath(dataset_id=ds, path_order=order, path_sequence=r.path, cost=r.cost,
                                            derived=True))
    return rows


def sync(store, catalog: MetadataCatalog | None = None) -> dict[str, int]:
    """Write every route into dataset_lineage and recompute the derived dataset_recovery_paths (one
    transaction); the operator's recovery paths are left as written. Each stage's tables and column
    lineage come from what apply derived (brought up to date first), so no SQL is parsed for the
    stages that did not change."""
    from lakehouse.metadata.derived import read_derived, refresh
    from lakehouse.metadata.store import TABLES

    catalog = catalog or store.load()
    store.create_all()
    with store.engine.begin() as conn:
        refresh(conn, catalog)
        derived = read_derived(conn)
    _EDGE_CACHE.pop(id(catalog), None)
    edges = all_edges(catalog, derived)
    graph = build_graph(catalog)
    lin_t, lin_json = TABLES["dataset_lineage"]
    rp_t, rp_json = TABLES["dataset_recovery_paths"]
    store.create_all()
    with store.engine.begin() as conn:
        # rows from before the `derived` column existed (NULL) were all derived: they go too
        is_derived = sa.or_(rp_t.c.derived.is_(True), rp_t.c.derived.is_(None))
        mine = set(conn.execute(sa.select(rp_t.c.dataset_id, rp_t.c.path_order).where(sa.not_(is_derived))).all())
        kept = [p for p in operator_paths(catalog) if (p.dataset_id, p.path_order) in mine]
        paths = recovery_paths(graph, kept)
        conn.execute(sa.delete(lin_t).where(
            sa.or_(lin_t.c.transform_name.like(STAGE_PREFIX + "%"), lin_t.c.transform_name.like(ALT_PREFIX + "%"))))
        for e in edges:
            store._upsert(conn, lin_t, lin_json, DatasetLineage, e)
        conn.execute(sa.delete(rp_t).where(is_derived))
        for p in paths:
            conn.execute(sa.insert(rp_t).values(**store._row(p, rp_json)))
    return {"dataset_lineage": len(edges), "dataset_recovery_paths": len(paths) + len(kept)}
