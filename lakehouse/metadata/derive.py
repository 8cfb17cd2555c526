"""The columns every stage outputs, derived from metadata alone (no Spark).

A pure function of the metadata catalog and, optionally, the live schemas of tables that already
exist: `derive_columns(catalog, live, planned)` → {target_id: StageColumns}. The results are plain
data (`to_dict`) so they can be stored with the metadata and compared later.

Where the columns come from, per stage:
* files / s3 source: its declared `columns` (+ `promote_fields`, + `_source_file` / `_ingested_at`
  when `lineage_columns`); with no declared columns, the existing table's columns; else not
  checkable before the first load (and said so, never guessed);
* jdbc source: at least its primary key, watermark and partition columns, declared columns and a
  schema contract's expected columns — the database decides the rest, so the list is open;
* iceberg source, or a source_id naming another stage's target: that table's columns;
* SQL: sqlglot's `qualify` + `annotate_types` with the upstream tables' columns as the schema.
Then what the write does to them: a schema contract with policy freeze/fail drops input columns it
does not expect, and columns of the existing table that the input lacks are written as NULLs.

`complete` says the list is exact; an open list ("at least these") is never used to call a
column missing. A column the SQL reads that no upstream has is reported (`sql_error`) only when
every upstream's columns are exact and the query has no construct sqlglot cannot type for Spark
(generators, LATERAL VIEW, table functions).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lakehouse.metadata.model import MetadataCatalog, Rule, Stage

LINEAGE_COLUMNS: dict[str, str] = {"_source_file": "string", "_ingested_at": "timestamp"}
#: live schemas: table identifier (db.table, lower case) -> {column: Spark SQL type}; only `.get` is
#: used, so a lazy reader of the catalog (lakehouse.table.catalog.LiveTables) works as well as a dict
LiveSchemas = Mapping[str, Mapping[str, str | None]]


@dataclass
class StageColumns:
    """The output columns of one stage (names lower case, types Spark SQL or None)."""

    target_id: str
    columns: dict[str, str | None] = field(default_factory=dict)
    complete: bool = False  # True: exactly these; False: at least these
    origin: str = ""  # where the columns come from, in words
    unknown: str | None = None  # why they cannot be known before a run (columns then empty)
    sql_error: dict[str, Any] | None = None  # {"message", "line", "col"}: the SQL reads a missing column

    def has(self, column: str) -> bool | None:
        """True / False when it can be told, None when the list is open and lacks the column."""
        if column.lower() in self.columns:
            return True
        return False if self.complete else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StageColumns:
        return cls(**d)


def _unknown(target_id: str, why: str) -> StageColumns:
    return StageColumns(target_id, {}, False, "", why)


def stage_rules(catalog: MetadataCatalog, stage: Stage) -> list[Rule]:
    if not stage.validation_set_id:
        return []
    try:
        return catalog.rule_set(stage.validation_set_id).rules
    except KeyError:
        return []


def _source(catalog: MetadataCatalog, source_id: str | None):
    """The source row named by `source_id`, or None (a stage may name another stage's target)."""
    try:
        return catalog.source(source_id) if source_id else None
    except KeyError:
        return None


def _iceberg_target(catalog: MetadataCatalog, target_id: str | None):
    try:
        t = catalog.target(target_id) if target_id else None
    except KeyError:
        return None
    return t if t is not None and t.kind == "iceberg" else None


def stage_upstreams(catalog: MetadataCatalog, stage: Stage) -> list[str]:
    """Identifiers (db.table, lower case) of the tables a stage reads; [] when it reads a source."""
    if stage.python_transformation is not None:
        return [i.lower() for i in stage.python_transformation.inputs]
    if stage.transformation:
        from lakehouse.sql.parse import SqlParseError, shared_query, tables_in_tree  # sqlglot: SQL stages only

        try:
            return tables_in_tree(shared_query(stage.transformation))
        except SqlParseError:
            return []
    src = _source(catalog, stage.source_id)
    if src is not None:
        return [src.table_identifier.lower()] if src.kind == "iceberg" and src.table_identifier else []
    tgt = _iceberg_target(catalog, stage.source_id)
    return [tgt.identifier.lower()] if tgt is not None else []


def derive_columns(catalog: MetadataCatalog, live: LiveSchemas | None = None,
                   planned: set[str] | None = None, needed: set[str] | None = None,
                   upstreams: Mapping[str, list[str]] | None = None) -> dict[str, StageColumns]:
    """{target_id: StageColumns} for every stage whose target is an iceberg target.

    `live`: schemas of tables that exist now. `planned`: target ids a run is about to write; a
    table outside it is read as it is (its live schema wins), one inside it as the metadata says.
    `needed`: only these targets (and what they read, transitively) — a run's check then reads the
    live schema of its own tables only. `upstreams`: target id -> the tables its stage reads, as
    apply stored them (StageDerivation.upstream_tables), so that those stages' SQL is not parsed.
    """
    # the standard library's sorter, not networkx: this runs in every run's pre-run check, and
    # importing networkx costs a small `lakehouse run` ~0.2 s of CPU for one topological order
    from graphlib import CycleError, TopologicalSorter

    def live_of(ident: str) -> dict[str, str | None] | None:
        have = live.get(ident.lower()) if live is not None else None
        return None if have is None else {c.lower(): t for c, t in have.items()}

    targets = {t.target_id: t for t in catalog.targets if t.kind == "iceberg"}
    stages = [s for s in catalog.stages if s.target_id in targets]
    producer = {targets[s.target_id].identifier.lower(): s for s in stages}
    preds: dict[str, set[str]] = {s.target_id: set() for s in stages}  # target -> the targets it reads
    for s in stages:
        known = upstreams.get(s.target_id) if upstreams is not None else None
        for ident in (known if known is not None else stage_upstreams(catalog, s)):
            if ident in producer:
                preds[s.target_id].add(producer[ident].target_id)
    try:
        order = list(TopologicalSorter(preds).static_order())
    except CycleError:  # a cycle: reported by the reference checks
        return {}
    if needed is not None:  # what they read, transitively, unless a run reads it as it is now
        keep: set[str] = set()
        stack = [t for t in needed if t in preds]
        while stack:
            t = stack.pop()
            if t not in keep:
                keep.add(t)
                stack += [u for u in preds[t] if planned is None or u in planned
                          or live_of(targets[u].identifier) is None]
        order = [t for t in order if t in keep]
    by_target = {s.target_id: s for s in stages}
    out: dict[str, StageColumns] = {}

    def table(ident: str) -> StageColumns | None:
        """The columns a reader of `ident` sees."""
        st = producer.get(ident)
        have = live_of(ident)
        if st is None or (planned is not None and st.target_id not in planned and have is not None):
            return StageColumns(ident, dict(have), True, f"live table {ident}") if have is not None else None
        return out.get(st.target_id)

    for tid in order:
        stage = by_target[tid]
        out[tid] = _after_write(catalog, stage, _input_columns(catalog, stage, table),
                                live_of(targets[tid].identifier))
    return out


def _input_columns(catalog: MetadataCatalog, stage: Stage, table) -> StageColumns:
    tid = stage.target_id
    if stage.python_transformation is not None:
        return _unknown(tid, f"python transformation {stage.python_transformation.function}: its output columns "
                             "are known only once it has run")
    if stage.transformation:
        return sql_columns(tid, stage.transformation, table)
    src = _source(catalog, stage.source_id)
    if src is None:  # a source_id naming another stage's target: SELECT * of it
        tgt = _iceberg_target(catalog, stage.source_id)
        up = table(tgt.identifier.lower()) if tgt is not None else None
        if up is None or up.unknown:
            return _unknown(tid, f"it reads {stage.source_id!r}, whose columns are not known before its first load")
        return StageColumns(tid, dict(up.columns), up.complete, f"table {tgt.identifier}")
    declared = {c.name.lower(): c.type.lower() for c in src.columns}
    if src.kind in ("files", "s3"):
        if not declared:
            return _unknown(tid, f"{src.kind} source {src.source_id!r} declares no columns (they are inferred from "
                                 "the files): not checkable before the first load; declare `columns:` on the "
                                 "source to check them now")
        cols = dict(declared)
        cols.update({p.column.lower(): None for p in src.promote_fields})
        if src.lineage_columns:
            cols.update(LINEAGE_COLUMNS)
        return StageColumns(tid, cols, True, f"columns declared on source {src.source_id!r}")
    if src.kind == "iceberg":
        up = table((src.table_identifier or "").lower())
        if up is None or up.unknown:
            return _unknown(tid, f"iceberg source {src.source_id!r} reads {src.table_identifier}, which does not "
                                 "exist yet")
        return StageColumns(tid, dict(up.columns), up.complete, f"table {src.table_identifier}")
    # jdbc: the database decides; what the metadata names is there for sure
    cols = dict(declared)
    for name in [*src.primary_key, src.watermark_column, src.partition_column]:
        if name:
            cols.setdefault(name.lower(), None)
    for r in stage_rules(catalog, stage):
        if r.type == "schema_contract" and r.enabled:
            for c in r.expected_columns:
                cols.setdefault(c.name.lower(), c.type.lower())
    return StageColumns(tid, cols, False, f"jdbc source {src.source_id!r} (the database decides the rest)")


def _after_write(catalog: MetadataCatalog, stage: Stage, cols: StageColumns,
                 table_now: Mapping[str, str | None] | None) -> StageColumns:
    """What the audit branch holds: contracts (freeze/fail) drop unexpected input columns; the
    existing table's columns the input lacks are written as NULLs (lakehouse.engines.spark.write)."""
    contracts = [r for r in stage_rules(catalog, stage) if r.type == "schema_contract" and r.enabled]
    if cols.unknown:
        if table_now is None:
            return cols
        # Iceberg rejects input columns the table lacks unless a contract evolves it
        evolve = any(r.schema_policy == "evolve" for r in contracts)
        return StageColumns(cols.target_id, dict(table_now), not evolve and not cols.sql_error,
                            "the existing table", sql_error=cols.sql_error)
    out = dict(cols.columns)
    if contracts and not any(r.schema_policy == "evolve" for r in contracts):
        keep = {c.name.lower() for r in contracts for c in r.expected_columns} | set(table_now or {})
        out = {c: t for c, t in out.items() if c in keep or c.startswith("_")}
    for c, t in (table_now or {}).items():
        out.setdefault(c, t)
    return StageColumns(cols.target_id, out, cols.complete, cols.origin + (" and the existing table" if table_now
                                                                            else ""), sql_error=cols.sql_error)


#: query parts whose output names or columns sqlglot does not model the way Spark does
_UNCERTAIN = ("Lateral", "Unnest", "Pivot", "Explode", "ExplodeOuter", "Posexplode", "PosexplodeOuter", "Inline",
              "UDTF", "TableFromRows")
_UNRESOLVED = re.compile(r"Column '(?P<col>[^']+)' could not be resolved(?: for table: '(?P<tbl>[^']+)')?"
                         r"(?:\. Line: (?P<line>\d+), Col: (?P<col_no>\d+))?")


def sql_columns(target_id: str, sql: str, table) -> StageColumns:
    """Output columns of a stage's SQL, given `table(identifier)` -> StageColumns | None of what it reads."""
    from sqlglot import exp
    from sqlglot.errors import SqlglotError
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify
    from sqlglot.schema import MappingSchema

    from lakehouse.sql.parse import DIALECT, SqlParseError, parse_query, tables_in_tree

    try:
        tree = parse_query(sql)
    except SqlParseError as exc:
        return _unknown(target_id, f"its SQL does not parse ({exc})")
    schema: dict[str, dict[str, dict[str, str]]] = {}
    for ident in tables_in_tree(tree):
        up = table(ident)
        if up is None or up.unknown:
            return _unknown(target_id, f"it reads {ident}, whose columns are not known before its first load")
        if not up.complete:
            return _unknown(target_id, f"it reads {ident}, whose columns are only partly known before it exists")
        db, _, name = ident.rpartition(".")
        schema.setdefault(db, {})[name] = {c: (t or "unknown") for c, t in up.columns.items()}
    for t in tree.find_all(exp.Table):  # lake tables are db.table; a catalog prefix is the lake itself
        t.set("catalog", None)
    uncertain = any(getattr(exp, k, None) is not None and tree.find(getattr(exp, k)) for k in _UNCERTAIN) or any(
        not isinstance(t.this, exp.Identifier) for t in tree.find_all(exp.Table))
    named = all(isinstance(e, (exp.Alias, exp.Column)) for e in tree.selects)
    try:
        mapping = MappingSchema(schema, dialect=DIALECT)
        q = qualify(tree, schema=mapping, dialect=DIALECT, validate_qualify_columns=True, quote_identifiers=False)
        q = annotate_types(q, schema=mapping, dialect=DIALECT)
    except SqlglotError as exc:
        m = _UNRESOLVED.search(str(exc))
        if m and not uncertain:
            where = f" of {m['tbl']}" if m["tbl"] else ""
            return StageColumns(target_id, {}, False, "", "its SQL reads a column that does not exist", {
                "message": f"column {m['col']!r}{where}, which none of its tables has ({_list_columns(schema)})",
                # sqlglot points at the end of the name; people count from its start
                "line": int(m["line"]) if m["line"] else None,
                "col": max(1, int(m["col_no"]) - len(m["col"]) + 1) if m["col_no"] else None,
                "column": m["col"]})
        return _unknown(target_id, f"sqlglot cannot resolve its columns ({str(exc).splitlines()[0]}); Spark "
                                   "checks them when the run starts")
    cols: dict[str, str | None] = {}
    for sel in q.selects:
        typ = sel.type.sql(DIALECT).lower() if sel.type is not None else "unknown"
        cols[sel.alias_or_name.lower()] = None if "unknown" in typ else typ
    complete = named and not uncertain and "*" not in cols
    return StageColumns(target_id, cols, complete, "its SQL" + ("" if complete else " (names partly Spark's own)"))


def _list_columns(schema: dict[str, dict[str, dict[str, str]]]) -> str:
    parts = []
    for db, tables in schema.items():
        for name, cols in tables.items():
            parts.append(f"{db}.{name}: {', '.join(cols)}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- derived once, at apply
#
# What the definitions need from a stage's SQL and rules — the tables it reads, its column lineage,
# its output columns and its check specs — is derived by `metadata apply` and stored with the
# metadata (`lakehouse.metadata.derived`, table `derived_stages`), so that loading the definitions
# parses no SQL. Each stage's row carries two hashes: `inputs_hash` of the rows its derivation reads
# (the stage, its target, its source, its rule set; as stored), and `fingerprint`, which adds the
# columns of the tables it reads. A re-apply derives again only the stages whose fingerprint moved:
# an edited SQL file re-derives its stage, and a downstream stage only if the columns it reads changed.

#: bump when what is derived, or how, changes: every stage is then derived again at the next apply
DERIVATION_VERSION = "1"


@dataclass
class StageDerivation:
    """What apply derives for one stage (plain data: stored as JSON, compared as values)."""

    pipeline_id: str
    stage_name: str
    target_id: str
    inputs_hash: str = ""
    fingerprint: str = ""
    #: tables (db.table, lower case) the stage reads: its SQL's, or the iceberg table its source names
    upstream_tables: list[str] = field(default_factory=list)
    #: output column -> [[table it reads, column], ...], from the SQL (sqlglot lineage); {} without SQL
    column_lineage: dict[str, list[list[str]]] = field(default_factory=dict)
    lineage_note: str | None = None  # why (part of) the column lineage could not be derived
    columns: StageColumns | None = None  # output columns from the metadata alone (no live schemas)
    #: one per rule of the stage's rule set: name, description, blocking, metadata
    check_specs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.pipeline_id, self.stage_name


def row_digest(row: Mapping[str, Any]) -> str:
    """Digest of one control-DB row as stored (JSON fields as their stored text). Unset (NULL)
    fields are left out, so a column added by an upgrade does not make every row look changed."""
    import hashlib
    import json

    canon = json.dumps({k: v for k, v in row.items() if v is not None}, sort_keys=True, default=str)
    return hashlib.sha256(canon.encode()).hexdigest()


#: (section, key) -> row_digest of the row as stored
Digests = Mapping[tuple[str, tuple], str]


@functools.cache
def _sqlglot_version() -> str:
    """Lineage and columns come from sqlglot: an upgrade derives every stage again (read from the
    installed distribution, so that loading the definitions does not import sqlglot)."""
    from importlib.metadata import version

    return version("sqlglot")


def stage_inputs_hash(catalog: MetadataCatalog, stage: Stage, digests: Digests) -> str:
    """Hash of every row the stage's own derivation reads (and of the deriving code's version)."""
    import hashlib

    parts = [DERIVATION_VERSION, _sqlglot_version(), digests.get(("stages", stage.key()), "-"),
             digests.get(("targets", (stage.target_id,)), "-")]
    if stage.source_id:
        section = "sources" if ("sources", (stage.source_id,)) in digests else "targets"
        parts.append(digests.get((section, (stage.source_id,)), "-"))
    if stage.validation_set_id:
        parts.append(digests.get(("validation_rules", (stage.validation_set_id,)), "-"))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def stage_check_specs(catalog: MetadataCatalog, stage: Stage) -> list[dict[str, Any]]:
    """The asset check of each rule of the stage, as plain data."""
    from lakehouse.validation.rules import describe

    return [{"name": r.name, "description": r.description or f"{r.type} ({r.severity}, action {r.action})",
             "blocking": r.severity == "error",
             "metadata": {"rule_type": r.type, "severity": r.severity, "action": r.action, "enabled": r.enabled,
                          "rule_expression": describe(r)}}
            for r in stage_rules(catalog, stage)]


def stage_column_lineage(stage: Stage) -> tuple[dict[str, list[list[str]]], str | None]:
    """({output column: [[table, column], ...]}, note) from the stage's SQL; the note says what is
    missing (a star without known columns, SQL sqlglot cannot read) instead of leaving it out silently."""
    if stage.python_transformation is not None:
        return {}, (f"column lineage unknown until run: python transformation {stage.python_transformation.function} "
                    f"reads {', '.join(stage.python_transformation.inputs) or 'no tables'}")
    if not stage.transformation:
        return {}, None
    from lakehouse.lineage.columns import column_lineage
    from lakehouse.sql.parse import SqlParseError

    try:
        cl = column_lineage(stage.transformation)
    except SqlParseError as exc:
        return {}, f"no column lineage: {exc}"
    note = (f"column lineage not derivable for {', '.join(sorted(set(cl.unresolved)))} (a * over columns the SQL "
            "does not name)") if cl.unresolved else None
    # sorted: sqlglot's walk does not always meet a column's sources in the same order
    return {col: sorted([t, c] for t, c in pairs) for col, pairs in cl.columns.items()}, note


def derive_stages(catalog: MetadataCatalog, digests: Digests,
                  previous: Mapping[tuple[str, str], StageDerivation] | None = None) -> dict[tuple[str, str],
                                                                                            StageDerivation]:
    """{(pipeline_id, stage_name): StageDerivation} of every stage, reusing each `previous` row whose
    fingerprint still matches (no SQL is parsed for those)."""
    import hashlib
    import json

    import networkx as nx

    previous = previous or {}
    targets = {t.target_id: t for t in catalog.targets}
    stages = [s for s in catalog.stages if s.target_id in targets]
    producer = {targets[s.target_id].identifier.lower(): s for s in stages if targets[s.target_id].kind == "iceberg"}
    own: dict[tuple[str, str], str] = {}
    reads: dict[tuple[str, str], list[str]] = {}
    graph = nx.DiGraph()
    for s in stages:
        k = (s.pipeline_id, s.stage_name)
        own[k] = stage_inputs_hash(catalog, s, digests)
        old = previous.get(k)
        reads[k] = list(old.upstream_tables) if old is not None and old.inputs_hash == own[k] else \
            stage_upstreams(catalog, s)
        graph.add_node(k)
        for ident in reads[k]:
            up = producer.get(ident)
            if up is not None:
                graph.add_edge((up.pipeline_id, up.stage_name), k)
    try:
        order = list(nx.topological_sort(graph))
    except nx.NetworkXUnfeasible:  # a cycle (reported by the reference checks): derive without an order
        order = list(graph.nodes)
    by_key = {(s.pipeline_id, s.stage_name): s for s in stages}
    out: dict[tuple[str, str], StageDerivation] = {}

    def columns_of(ident: str) -> StageColumns | None:
        st = producer.get(ident)
        d = out.get((st.pipeline_id, st.stage_name)) if st is not None else None
        return d.columns if d is not None else None

    for k in order:
        stage = by_key[k]
        seen = [[i, (c.to_dict() if (c := columns_of(i)) is not None else None)] for i in reads[k]]
        fingerprint = hashlib.sha256((own[k] + json.dumps(seen, sort_keys=True)).encode()).hexdigest()
        old = previous.get(k)
        if old is not None and old.fingerprint == fingerprint:
            out[k] = old
            continue
        if old is not None and old.inputs_hash == own[k]:  # only what it reads changed: its SQL is the same
            lineage, note = old.column_lineage, old.lineage_note
        else:
            lineage, note = stage_column_lineage(stage)
        cols = None
        if targets[stage.target_id].kind == "iceberg":
            cols = _after_write(catalog, stage, _input_columns(catalog, stage, columns_of), None)
        out[k] = StageDerivation(stage.pipeline_id, stage.stage_name, stage.target_id, own[k], fingerprint,
                                 reads[k], lineage, note, cols, stage_check_specs(catalog, stage))
    return out
