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

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lakehouse.metadata.model import MetadataCatalog, Rule, Stage

LINEAGE_COLUMNS: dict[str, str] = {"_source_file": "string", "_ingested_at": "timestamp"}
#: live schemas: table identifier (db.table, lower case) -> {column: Spark SQL type}; only `.get` is
#: used, so a lazy reader of the catalog (lakehouse.catalog.LiveTables) works as well as a dict
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
    rs = next((r for r in catalog.validation_rules if r.rule_set_id == stage.validation_set_id), None)
    return rs.rules if rs is not None else []


def stage_upstreams(catalog: MetadataCatalog, stage: Stage) -> list[str]:
    """Identifiers (db.table, lower case) of the tables a stage reads; [] when it reads a source."""
    from lakehouse.sqlparse import SqlParseError, shared_query, tables_in_tree

    if stage.transformation:
        try:
            return tables_in_tree(shared_query(stage.transformation))
        except SqlParseError:
            return []
    src = next((s for s in catalog.sources if s.source_id == stage.source_id), None)
    if src is not None:
        return [src.table_identifier.lower()] if src.kind == "iceberg" and src.table_identifier else []
    tgt = next((t for t in catalog.targets if t.target_id == stage.source_id and t.kind == "iceberg"), None)
    return [tgt.identifier.lower()] if tgt is not None else []


def derive_columns(catalog: MetadataCatalog, live: LiveSchemas | None = None,
                   planned: set[str] | None = None, needed: set[str] | None = None) -> dict[str, StageColumns]:
    """{target_id: StageColumns} for every stage whose target is an iceberg target.

    `live`: schemas of tables that exist now. `planned`: target ids a run is about to write; a
    table outside it is read as it is (its live schema wins), one inside it as the metadata says.
    `needed`: only these targets (and what they read, transitively) — a run's check then reads the
    live schema of its own tables only.
    """
    import networkx as nx

    def live_of(ident: str) -> dict[str, str | None] | None:
        have = live.get(ident.lower()) if live is not None else None
        return None if have is None else {c.lower(): t for c, t in have.items()}

    targets = {t.target_id: t for t in catalog.targets if t.kind == "iceberg"}
    stages = [s for s in catalog.stages if s.target_id in targets]
    producer = {targets[s.target_id].identifier.lower(): s for s in stages}
    graph = nx.DiGraph()
    for s in stages:
        graph.add_node(s.target_id)
        for ident in stage_upstreams(catalog, s):
            if ident in producer:
                graph.add_edge(producer[ident].target_id, s.target_id)
    try:
        order = list(nx.topological_sort(graph))
    except nx.NetworkXUnfeasible:  # a cycle: reported by the reference checks
        return {}
    if needed is not None:  # what they read, transitively, unless a run reads it as it is now
        keep: set[str] = set()
        stack = [t for t in needed if t in graph]
        while stack:
            t = stack.pop()
            if t not in keep:
                keep.add(t)
                stack += [u for u in graph.predecessors(t) if planned is None or u in planned
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
    if stage.transformation:
        return sql_columns(tid, stage.transformation, table)
    src = next((s for s in catalog.sources if s.source_id == stage.source_id), None)
    if src is None:  # a source_id naming another stage's target: SELECT * of it
        tgt = next((t for t in catalog.targets if t.target_id == stage.source_id and t.kind == "iceberg"), None)
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
    existing table's columns the input lacks are written as NULLs (lakehouse.validation.wap)."""
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

    from lakehouse.sqlparse import DIALECT, SqlParseError, parse_query, tables_in_tree

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
