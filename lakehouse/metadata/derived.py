"""Derived metadata in the control DB: what `metadata apply` computes from each stage's SQL and rules,
and the read that builds the definitions from it.

`refresh` runs inside apply's transaction (and after `MetadataStore.upsert` of a stage, target,
source or rule set): it hashes the rows as stored, derives again only the stages whose fingerprint
moved (`lakehouse.metadata.derive.derive_stages`) and writes `derived_stages`. `read_structure`
is the one read the definitions make: the structural tables and the derived rows, in one
connection, without creating or altering anything, and without parsing SQL — unless a stage was
changed behind apply's back (plain SQL), in which case that stage is derived in memory and the
operator is told to run `lakehouse metadata derive`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa

from lakehouse.metadata.checks import Baseline
from lakehouse.metadata.derive import (
    StageColumns,
    StageDerivation,
    derive_stages,
    row_digest,
    stage_check_specs,
    stage_column_lineage,
    stage_inputs_hash,
    stage_upstreams,
)
from lakehouse.metadata.model import DEFAULT_CODE_LOCATION, Entity, MetadataCatalog, Stage
from lakehouse.metadata.schema import TABLES, derived_stages

log = logging.getLogger(__name__)


class MetadataStore(Protocol):
    """What derive_now / read_structure need of lakehouse.metadata.store.MetadataStore, typed here:
    the store calls `refresh` inside apply, so this module must not import it back."""

    url: str
    engine: sa.Engine

    def load(self, sections: Iterable[str] | None = None) -> MetadataCatalog: ...

    def entity(self, section: str, row: Mapping[str, Any]) -> Entity: ...

#: the tables whose rows a stage's derivation reads
INPUT_SECTIONS = frozenset({"stages", "targets", "sources", "validation_rules"})
#: what the definitions are built from
#: platform_settings: the engine defaults say which engine writes a stage (its asset's kinds)
STRUCTURE_SECTIONS = ("pipelines", "stages", "targets", "sources", "validation_rules", "applications",
                      "platform_settings")
_JSON = ("upstream_tables", "column_lineage", "check_specs", "output_columns")


@dataclass
class RefreshReport:
    total: int = 0
    rederived: list[tuple[str, str]] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)


def _key_of(section: str, row: Mapping[str, Any]) -> tuple:
    table, _ = TABLES[section]
    return tuple(row[c.name] for c in table.primary_key.columns)


def digests_of(rows: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[tuple[str, tuple], str]:
    """(section, key) -> digest of every row of the input sections, as stored."""
    return {(section, _key_of(section, r)): row_digest(r) for section in INPUT_SECTIONS for r in rows.get(section, ())}


def _raw_rows(conn: sa.Connection, sections: Iterable[str]) -> dict[str, list[Mapping[str, Any]]]:
    return {s: list(conn.execute(sa.select(TABLES[s][0])).mappings()) for s in sections}


def _from_row(r: Mapping[str, Any]) -> StageDerivation:
    d = {k: (json.loads(r[k]) if r[k] is not None else None) for k in _JSON}
    cols = d["output_columns"]
    return StageDerivation(r["pipeline_id"], r["stage_name"], r["target_id"], r["inputs_hash"], r["fingerprint"],
                           d["upstream_tables"] or [], d["column_lineage"] or {}, r["lineage_note"],
                           StageColumns.from_dict(cols) if cols is not None else None, d["check_specs"] or [])


def _to_row(d: StageDerivation, now: datetime) -> dict[str, Any]:
    return {"pipeline_id": d.pipeline_id, "stage_name": d.stage_name, "target_id": d.target_id,
            "inputs_hash": d.inputs_hash, "fingerprint": d.fingerprint,
            "upstream_tables": json.dumps(d.upstream_tables), "column_lineage": json.dumps(d.column_lineage),
            "lineage_note": d.lineage_note,
            "output_columns": json.dumps(d.columns.to_dict()) if d.columns is not None else None,
            "check_specs": json.dumps(d.check_specs), "derived_at": now}


def read_derived(conn: sa.Connection) -> dict[tuple[str, str], StageDerivation]:
    return {(r["pipeline_id"], r["stage_name"]): _from_row(r) for r in conn.execute(sa.select(derived_stages)).mappings()}


def stored_derivations(store: MetadataStore, catalog: MetadataCatalog,
                       stages: Iterable[Stage]) -> dict[tuple[str, str], StageDerivation]:
    """What apply stored for `stages`, each only if it is up to date with the rows as stored now
    (their inputs hash, over just the rows a stage's derivation reads): what a run asks of its own
    stages instead of parsing their SQL again. A stage changed behind apply's back, or a control DB
    without the table, is left out, and the caller derives that stage from its SQL as before."""
    stages = list(stages)
    keys = {(s.pipeline_id, s.stage_name): s for s in stages}
    if not keys:
        return {}
    pids = {k[0] for k in keys}
    tids = {s.target_id for s in stages} | {s.source_id for s in stages if s.source_id}
    rule_sets = {s.validation_set_id for s in stages if s.validation_set_id}
    st_t, tg_t, so_t, vr_t = (TABLES[s][0] for s in ("stages", "targets", "sources", "validation_rules"))
    t = derived_stages
    try:
        with store.engine.connect() as conn:
            stored = [r for r in conn.execute(sa.select(t).where(t.c.pipeline_id.in_(pids))).mappings()
                      if (r["pipeline_id"], r["stage_name"]) in keys]
            if not stored:
                return {}
            rows = {"stages": [r for r in conn.execute(sa.select(st_t).where(st_t.c.pipeline_id.in_(pids))).mappings()
                               if (r["pipeline_id"], r["stage_name"]) in keys],
                    "targets": list(conn.execute(sa.select(tg_t).where(tg_t.c.target_id.in_(tids))).mappings()),
                    "sources": list(conn.execute(sa.select(so_t).where(so_t.c.source_id.in_(tids))).mappings()),
                    "validation_rules": list(conn.execute(
                        sa.select(vr_t).where(vr_t.c.rule_set_id.in_(rule_sets))).mappings()) if rule_sets else []}
    except sa.exc.DBAPIError as exc:  # no derived_stages yet (a control DB apply has not upgraded)
        log.debug("no stored derivations: %s", exc)
        return {}
    digests = digests_of(rows)
    out = {}
    for r in stored:
        d = _from_row(r)
        if d.inputs_hash == stage_inputs_hash(catalog, keys[d.key], digests):
            out[d.key] = d
    return out


def read_baseline(conn: sa.Connection, catalog: MetadataCatalog) -> Baseline:
    """`catalog` (the metadata as stored, read on `conn`) with its derived rows that are up to date:
    what a re-apply compares against, so that it checks only what changed. A row whose stage was
    changed behind apply's back (plain SQL) is left out, and that stage is checked again."""
    digests = digests_of(_raw_rows(conn, INPUT_SECTIONS))
    stages = {(s.pipeline_id, s.stage_name): s for s in catalog.stages}
    fresh = {k: d for k, d in read_derived(conn).items()
             if k in stages and d.inputs_hash == stage_inputs_hash(catalog, stages[k], digests)}
    return Baseline(catalog, fresh)


def refresh(conn: sa.Connection, catalog: MetadataCatalog, *, force: bool = False) -> RefreshReport:
    """Derive what changed and write it, in the caller's transaction. `catalog` is what the
    connection's tables hold now (apply's merged result); `force` derives every stage again."""
    digests = digests_of(_raw_rows(conn, INPUT_SECTIONS))
    before = {} if force else read_derived(conn)
    after = derive_stages(catalog, digests, before)
    report = RefreshReport(total=len(after))
    now = datetime.now(UTC)
    t = derived_stages
    for key, d in after.items():
        if before.get(key) is d:
            continue  # reused as it was
        report.rederived.append(key)
        conn.execute(sa.delete(t).where(t.c.pipeline_id == key[0], t.c.stage_name == key[1]))
        conn.execute(sa.insert(t).values(**_to_row(d, now)))
    stored = set(before) if not force else {(r[0], r[1]) for r in conn.execute(sa.select(t.c.pipeline_id,
                                                                                          t.c.stage_name))}
    for key in sorted(stored - set(after)):
        report.removed.append(key)
        conn.execute(sa.delete(t).where(t.c.pipeline_id == key[0], t.c.stage_name == key[1]))
    return report


def derive_now(store: MetadataStore, *, force: bool = False) -> RefreshReport:
    """`lakehouse metadata derive`: bring the derived rows up to date with the metadata as stored
    (after a plain-SQL edit, or an upgrade from a version that stored none)."""
    catalog = store.load()
    with store.engine.begin() as conn:
        return refresh(conn, catalog, force=force)


# ---------------------------------------------------------------------------------- the definitions' read
@dataclass
class Structure:
    """What the definitions are built from: the structural rows and each stage's derived data."""

    catalog: MetadataCatalog
    derived: dict[tuple[str, str], StageDerivation]
    #: stages whose stored derivation was missing or out of date, derived in memory for this load
    derived_here: list[tuple[str, str]] = field(default_factory=list)
    missing_tables: list[str] = field(default_factory=list)
    #: read for one code location (`read_structure(location=...)`): the pipelines it serves; None: every
    #: pipeline (the only location there is)
    location_pipelines: set[str] | None = None


def read_structure(store: MetadataStore, pipelines: Iterable[str] | None = None, *,
                   location: str | None = None) -> Structure:
    """The structural metadata and the derived rows, read in one connection. Creates and writes
    nothing: a control DB without the tables reads as empty (apply creates them).

    `pipelines`: only what these pipelines' stages need (their stages, the targets and sources they
    name, the stages producing the tables they read), for a run that builds one pipeline.
    `location`: a code location's pipelines (`Pipeline.code_location`), scoped like `pipelines`; the
    default location reads everything (it also serves what is not per pipeline) and names its
    pipelines in `location_pipelines`, None when every pipeline is in it (the one location there is).
    """
    from lakehouse.table.sqlite_files import sqlite_path

    path = sqlite_path(store.url)
    if path is not None and not path.exists():
        return Structure(MetadataCatalog(), {}, missing_tables=[f"{path} (no control DB yet)"])
    with store.engine.connect() as conn:
        have = set(sa.inspect(conn).get_table_names())
        sections = [s for s in STRUCTURE_SECTIONS if TABLES[s][0].name in have]
        rows = _raw_rows(conn, sections)
        raw_derived = {(r["pipeline_id"], r["stage_name"]): r for r in conn.execute(sa.select(derived_stages)).mappings()
                       } if derived_stages.name in have else {}
    missing = [t for t in (*STRUCTURE_SECTIONS, derived_stages.name) if t not in have]
    wanted = set(pipelines) if pipelines is not None else None
    served: set[str] | None = None
    if location is not None and wanted is None:
        served, split = _served_by(rows.get("pipelines", ()), location)
        if location != DEFAULT_CODE_LOCATION:
            wanted = served
        elif not split:
            served = None
    if wanted is not None:
        rows = _scoped(rows, raw_derived, wanted)
    in_scope = {(r["pipeline_id"], r["stage_name"]) for r in rows.get("stages", ())}
    stored = {k: _from_row(r) for k, r in raw_derived.items() if k in in_scope}
    data = {s: sorted((store.entity(s, r) for r in rows.get(s, ())), key=lambda e: tuple(str(x) for x in e.key()))
            for s in sections}
    catalog = MetadataCatalog(**data)
    digests = digests_of(rows)
    derived: dict[tuple[str, str], StageDerivation] = {}
    here: list[tuple[str, str]] = []
    for st in catalog.stages:
        key = (st.pipeline_id, st.stage_name)
        d = stored.get(key)
        own = stage_inputs_hash(catalog, st, digests)
        if d is None or d.inputs_hash != own:
            d = StageDerivation(st.pipeline_id, st.stage_name, st.target_id, own, "", stage_upstreams(catalog, st),
                                *stage_column_lineage(st), None, stage_check_specs(catalog, st))
            here.append(key)
        derived[key] = d
    if here:
        log.warning("%d stage(s) have no up-to-date derived metadata in the control DB (changed without "
                    "`lakehouse metadata apply`, or stored by an older version): derived them while loading (%s). "
                    "Run `lakehouse metadata derive` to store them, so loading parses no SQL.", len(here),
                    ", ".join(".".join(k) for k in here[:10]) + (" …" if len(here) > 10 else ""))
    return Structure(catalog, derived, here, missing, served)


def _served_by(pipelines: Iterable[Mapping[str, Any]], location: str) -> tuple[set[str], bool]:
    """(the pipelines `location` serves, whether any pipeline is in another location)."""
    served, split = set(), False
    for r in pipelines:
        if (r.get("code_location") or DEFAULT_CODE_LOCATION) == location:
            served.add(r["pipeline_id"])
        else:
            split = True
    return served, split


def _scoped(rows: dict[str, list[Mapping[str, Any]]], stored: Mapping[tuple[str, str], Mapping[str, Any]],
            wanted: set[str]) -> dict[str, list[Mapping[str, Any]]]:
    """The rows a build of the `wanted` pipelines needs: their stages and the stages producing a
    table they read (for the asset keys of their deps), with the targets, sources, rule sets and
    pipelines those name."""
    targets = rows.get("targets", ())
    by_ident = {f"{r['namespace']}.{r['table']}".lower(): r["target_id"] for r in targets if r.get("kind") == "iceberg"}
    producer = {r["target_id"]: r for r in rows.get("stages", ())}
    keep = {(r["pipeline_id"], r["stage_name"]): r for r in rows.get("stages", ()) if r["pipeline_id"] in wanted}
    for r in list(keep.values()):
        d = stored.get((r["pipeline_id"], r["stage_name"]))
        reads = json.loads(d["upstream_tables"] or "[]") if d is not None else []
        for tid in [by_ident.get(i) for i in reads] + [r.get("source_id")]:
            up = producer.get(tid) if tid else None
            if up is not None:
                keep.setdefault((up["pipeline_id"], up["stage_name"]), up)
    stages = list(keep.values())
    tids = {r["target_id"] for r in stages} | {r["source_id"] for r in stages if r.get("source_id")}
    sids = {r["source_id"] for r in stages if r.get("source_id")}
    rule_sets = {r["validation_set_id"] for r in stages if r.get("validation_set_id")}
    pids = {r["pipeline_id"] for r in stages} | wanted
    return {**rows,
            "stages": stages,
            "targets": [r for r in targets if r["target_id"] in tids],
            "sources": [r for r in rows.get("sources", ()) if r["source_id"] in sids],
            "validation_rules": [r for r in rows.get("validation_rules", ()) if r["rule_set_id"] in rule_sets],
            "pipelines": [r for r in rows.get("pipelines", ()) if r["pipeline_id"] in pids],
            "applications": []}
