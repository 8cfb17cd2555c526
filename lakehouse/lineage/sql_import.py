"""`lakehouse sql import FILE.sql`: CREATE TABLE AS / INSERT INTO / COPY statements → metadata YAML.

Each CTAS / INSERT statement becomes a target, a stage whose transformation is the statement's
SELECT (table names resolved to lake identifiers), and dataset_lineage rows with column lineage.
The medallion layer comes from the names (a `bronze`/`silver`/`gold` token) or else from the
lineage (one layer above the highest upstream; aggregates land in gold). A Redshift `COPY t FROM
's3://…'` becomes an S3 source and a bronze stage loading it (`lakehouse.lineage.sql_copy`). The
result is validated merged with the current metadata before anything is written, so what comes
out applies cleanly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from lakehouse.lineage.columns import column_lineage
from lakehouse.lineage.graph import STAGE_PREFIX
from lakehouse.lineage.sql_copy import CopyImportError, import_copy
from lakehouse.metadata.loader import MetadataError, Origin, build_catalog
from lakehouse.metadata.model import (
    IDENT_RE,
    LAYERS,
    SECTIONS,
    DatasetLineage,
    MetadataCatalog,
    Pipeline,
    Source,
    Stage,
    Target,
)
from lakehouse.sql.parse import DIALECT, SqlParseError, table_name
from lakehouse.sql.parse import error_position as _position

LAYER_RANK = {"entity_raw": 0, "bronze": 1, "silver": 2, "gold": 3}
DEFAULT_PIPELINE = "sql_import"


class SqlImportError(ValueError):
    """A statement that cannot become metadata; the message names the file and statement."""


@dataclass
class ImportResult:
    pipelines: list[Pipeline] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    dataset_lineage: list[DatasetLineage] = field(default_factory=list)
    #: what a statement said that the metadata does not carry (e.g. COPY options), for the operator
    notes: list[str] = field(default_factory=list)

    def as_yaml_doc(self) -> dict[str, list[dict[str, Any]]]:
        doc: dict[str, list[dict[str, Any]]] = {}
        for section in ("pipelines", "sources", "targets", "stages", "dataset_lineage"):
            rows = getattr(self, section)
            if rows:
                doc[section] = [r.model_dump(mode="json", exclude_defaults=True) for r in rows]
        return doc

    def to_yaml(self, header: str = "") -> str:
        import yaml

        class _Literal(str):
            pass

        def literal(dumper, data):
            return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")

        yaml.SafeDumper.add_representer(_Literal, literal)
        doc = self.as_yaml_doc()
        for section in ("stages", "dataset_lineage"):
            for row in doc.get(section, []):
                for k in ("transformation", "transformation_sql"):
                    if k in row and "\n" in row[k]:
                        row[k] = _Literal(row[k].rstrip() + "\n")
        body = yaml.safe_dump(doc, sort_keys=False, width=100)
        notes = "".join(f"# note: {n}\n" for n in self.notes)
        return header + notes + body


def parse_statements(text: str, file_name: str = "<sql>", dialect: str = DIALECT) -> list[exp.Expression]:
    """Every statement of a SQL script; a syntax error names file, line and column."""
    try:
        stmts = [s for s in sqlglot.parse(text, read=dialect) if s is not None]
    except (ParseError, TokenError) as exc:
        line, col, desc = _position(text, exc)
        raise SqlParseError(f"{file_name}: cannot parse SQL at line {line}, column {col}: {desc}") from exc
    if not stmts:
        raise SqlImportError(f"{file_name}: no SQL statements found")
    return stmts


def _tokens(*names: str) -> set[str]:
    return {t for n in names if n for t in re.split(r"[^a-z0-9]+", n.lower()) if t}


def _is_aggregate(query: exp.Expression) -> bool:
    return bool(query.find(exp.Group)) or bool(query.find(exp.AggFunc))


def infer_layer(namespace: str | None, table: str, upstream_layers: list[str], query: exp.Expression) -> str:
    """Names first (a bronze/silver/gold token), then lineage: one above the highest upstream."""
    hinted = [lay for lay in ("gold", "silver", "bronze") if lay in _tokens(namespace or "", table)]
    if hinted:
        return hinted[0]
    if upstream_layers:
        top = max(LAYER_RANK[u] for u in upstream_layers)
        if top >= LAYER_RANK["silver"] or _is_aggregate(query):
            return "gold"
        return "silver"
    return "gold" if _is_aggregate(query) else "silver"


def _safe_ident(name: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not out or not (out[0].isalpha() or out[0] == "_"):
        out = "t_" + out
    return out[:128]


class _Resolver:
    """Table name in the SQL → (target_id, identifier, layer) in the metadata or in this file."""

    def __init__(self, catalog: MetadataCatalog):
        self.catalog = catalog
        self.local: dict[str, tuple[str, str, str]] = {}

    def add(self, names: list[str], target_id: str, identifier: str, layer: str) -> None:
        for n in names:
            self.local[n.lower()] = (target_id, identifier, layer)

    def _layer_of(self, target_id: str) -> str | None:
        st = self.catalog.stage_for_target(target_id)
        return st.layer if st else None

    def resolve(self, name: str) -> tuple[str, str, str | None] | None:
        n = name.lower()
        if n in self.local:
            return self.local[n]
        t = self.catalog.target_by_identifier(n)
        if t is None:
            t = next((x for x in self.catalog.targets if x.kind == "iceberg" and x.target_id.lower() == n), None)
        if t is None and "." not in n:
            same = [x for x in self.catalog.targets if x.kind == "iceberg" and (x.table or "").lower() == n]
            t = same[0] if len(same) == 1 else None
        if t is None:
            return None
        return t.target_id, t.identifier, self._layer_of(t.target_id)


def import_sql(text: str, catalog: MetadataCatalog, *, file_name: str = "<sql>", pipeline_id: str | None = None,
               dialect: str = DIALECT) -> ImportResult:
    """The metadata a SQL script implies, validated merged with `catalog`."""
    statements = parse_statements(text, file_name, dialect)
    st = _State(catalog, file_name, pipeline_id)
    for p in catalog.pipelines:
        st.orders[p.pipeline_id] = max((s.stage_order for s in catalog.stages_of(p.pipeline_id)), default=0)
    st.asset_keys = {(s.layer, catalog.target(s.target_id).table): s for s in catalog.stages}
    for i, stmt in enumerate(statements, start=1):
        where = f"{file_name}: statement {i}"
        if isinstance(stmt, exp.Copy):
            try:
                import_copy(st, stmt, i, where)
            except CopyImportError as exc:
                raise SqlImportError(str(exc)) from None
            continue
        ddl = _table_ddl(stmt)
        if ddl is not None:  # a plain CREATE TABLE: the column types of a COPY into it
            st.ddl[table_name(ddl[0])] = (ddl[1], where)
            continue
        _import_select(st, stmt, where, i, dialect)
    unused = [w for name, (_, w) in st.ddl.items() if name not in st.copied]
    if unused:
        raise SqlImportError(f"{unused[0]}: the statement has no SELECT (a plain CREATE TABLE has no lineage; it is "
                             "imported only as the columns of a COPY into the same table)")
    _validate_merged(catalog, st.res, file_name)
    return st.res


@dataclass
class _State:
    """What one import has decided so far (shared by SELECT and COPY statements)."""

    catalog: MetadataCatalog
    file_name: str
    pipeline_id: str | None
    res: ImportResult = field(default_factory=lambda: ImportResult())
    orders: dict[str, int] = field(default_factory=dict)
    asset_keys: dict[tuple[str, str], Stage] = field(default_factory=dict)
    ddl: dict[str, tuple[list, str]] = field(default_factory=dict)  # table -> (ColumnDefs, where)
    copied: set[str] = field(default_factory=set)
    resolver: _Resolver | None = None

    def __post_init__(self) -> None:
        self.resolver = _Resolver(self.catalog)

    def place(self, where: str, identifier: str, layer: str, table: str, target_id: str,
              upstream_ids: list[str]) -> tuple[str, int, str]:
        """(pipeline, stage_order, stage_name) of the stage writing `target_id`: the upstream producer's
        pipeline unless told otherwise; a table already in the metadata keeps its stage."""
        catalog, res = self.catalog, self.res
        pid = self.pipeline_id
        if pid is None:
            for up in upstream_ids:
                prod = catalog.stage_for_target(up) or next((s for s in res.stages if s.target_id == up), None)
                if prod is not None:
                    pid = prod.pipeline_id
                    break
        pid = pid or DEFAULT_PIPELINE
        if pid not in self.orders:
            res.pipelines.append(Pipeline(pipeline_id=pid, description=f"imported from {Path(self.file_name).name}"))
            self.orders[pid] = 0
        prev = catalog.stage_for_target(target_id)
        if prev is not None:  # re-importing a table: update its stage in place
            pid, order, stage_name = prev.pipeline_id, prev.stage_order, prev.stage_name
        else:
            self.orders[pid] += 1
            order = self.orders[pid]
            names = {s.stage_name for s in catalog.stages_of(pid)} | {s.stage_name for s in res.stages
                                                                       if s.pipeline_id == pid}
            stage_name = table if table not in names else f"{layer}_{table}"
            if not IDENT_RE.match(stage_name) or stage_name in names:
                raise SqlImportError(f"{where}: cannot name the stage for {identifier}: {stage_name!r} is taken")
        clash = self.asset_keys.get((layer, table))
        if clash is not None and clash.target_id != target_id:
            raise SqlImportError(
                f"{where}: {identifier} would be asset {layer}/{table}, already the asset of stage "
                f"{clash.pipeline_id}.{clash.stage_name} ({catalog.target(clash.target_id).identifier}); "
                "rename the table"
            )
        return pid, order, stage_name

    def target_for(self, ns: str | None, tbl: str, layer: str, write_mode: str) -> tuple[str, str, str, bool]:
        """(identifier, table, target_id, is_new) of the table a statement writes. An unqualified name
        that is a target id of the metadata is that target; one prefixed with its layer
        (`bronze_user_events`) is that layer's table (`bronze.user_events`)."""
        if ns is None:
            hit = next((t for t in self.catalog.targets if t.kind == "iceberg" and t.target_id.lower() == tbl.lower()),
                       None)
            if hit is not None:
                return hit.identifier, hit.table, hit.target_id, False
            if tbl.lower().startswith(layer + "_") and len(tbl) > len(layer) + 1:
                tbl = tbl[len(layer) + 1:]
        namespace = _safe_ident(ns or layer).lower()
        table = _safe_ident(tbl).lower()
        identifier = f"{namespace}.{table}"
        existing = self.catalog.target_by_identifier(identifier)
        target_id = existing.target_id if existing else _safe_ident(f"{namespace}_{table}")
        if existing is None:
            self.res.targets.append(Target(target_id=target_id, namespace=namespace, table=table,
                                           write_mode=write_mode,
                                           description=f"{identifier}, imported from {Path(self.file_name).name}"))
        return identifier, table, target_id, existing is None

    def added(self, stage: Stage, names: list[str], identifier: str) -> None:
        self.res.stages.append(stage)
        self.resolver.add(names, stage.target_id, identifier, stage.layer)
        self.asset_keys[(stage.layer, identifier.split(".", 1)[1])] = stage


def _import_select(st: _State, stmt: exp.Expression, where: str, i: int, dialect: str) -> None:
    """CREATE TABLE ... AS SELECT / INSERT INTO ... SELECT: a target, a SQL stage, lineage rows."""
    from lakehouse.sql.parse import tables_in_sql

    catalog, file_name = st.catalog, st.file_name
    target_table, query, write_mode, columns = _unpack(stmt, where)
    ns = target_table.db or None
    tbl = target_table.name
    ups = []
    for up in tables_in_sql(query.sql(dialect=dialect), dialect):
        r = st.resolver.resolve(up)
        if r is None:
            known = sorted(t.identifier for t in catalog.targets if t.kind == "iceberg")
            raise SqlImportError(
                f"{where}: table {up!r} is not a lake table in the metadata nor created earlier in "
                f"{file_name}; known tables: {known}. Import or define its producer first."
            )
        ups.append((up, *r))
    layer = infer_layer(ns, tbl, [u[3] for u in ups if u[3]], query)
    identifier, table, target_id, _ = st.target_for(ns, tbl, layer, write_mode)
    pid, order, stage_name = st.place(where, identifier, layer, table, target_id, [u[1] for u in ups])
    mapping = {u[0].lower(): u[2] for u in ups}
    select = _rewrite(query, mapping, columns)
    sql_text = select.sql(dialect=DIALECT, pretty=True)
    cl = column_lineage(select, dialect=DIALECT).by_upstream()
    st.added(Stage(pipeline_id=pid, stage_order=order, stage_name=stage_name, layer=layer, target_id=target_id,
                   transformation=sql_text, description=f"imported from {Path(file_name).name} (statement {i})"),
             [table_name(target_table), identifier, target_id], identifier)
    for _name, up_id, up_ident, _ in ups:
        st.res.dataset_lineage.append(DatasetLineage(
            from_dataset_id=up_id, to_dataset_id=target_id,
            transform_name=f"{STAGE_PREFIX}{pid}.{stage_name}", cost=1.0, is_default=True,
            transformation_sql=sql_text, column_lineage=cl.get(up_ident.lower(), {}),
        ))


def _table_ddl(stmt: exp.Expression) -> tuple[exp.Table, list] | None:
    """(table, column definitions) of a plain `CREATE TABLE t (col type, ...)`, else None."""
    if not (isinstance(stmt, exp.Create) and (stmt.args.get("kind") or "").upper() == "TABLE"):
        return None
    if stmt.expression is not None or not isinstance(stmt.this, exp.Schema):
        return None
    cols = [c for c in stmt.this.expressions if isinstance(c, exp.ColumnDef)]
    return (stmt.this.this, cols) if cols and isinstance(stmt.this.this, exp.Table) else None


def _unpack(stmt: exp.Expression, where: str) -> tuple[exp.Table, exp.Expression, str, list[str]]:
    columns: list[str] = []
    if isinstance(stmt, exp.Create) and (stmt.args.get("kind") or "").upper() == "TABLE":
        query, mode = stmt.expression, "overwrite"
    elif isinstance(stmt, exp.Insert):
        query = stmt.expression
        mode = "overwrite" if stmt.args.get("overwrite") else "append"
    else:
        kind = stmt.key.upper() if isinstance(stmt, exp.Expression) else type(stmt).__name__
        raise SqlImportError(f"{where}: only CREATE TABLE ... AS SELECT, INSERT INTO ... SELECT and COPY ... FROM "
                             f"'s3://...' can be imported, not {kind}: {stmt.sql()[:80]!r}")
    if not isinstance(query, exp.Query):
        raise SqlImportError(f"{where}: the statement has no SELECT (a plain CREATE TABLE has no lineage)")
    tgt = stmt.this
    if isinstance(tgt, exp.Schema):
        columns = [c.name for c in tgt.expressions if isinstance(c, (exp.Identifier, exp.Column, exp.ColumnDef))]
        tgt = tgt.this
    if not isinstance(tgt, exp.Table) or not tgt.name:
        raise SqlImportError(f"{where}: cannot tell which table the statement writes")
    return tgt, query, mode, columns


def _rewrite(query: exp.Expression, mapping: dict[str, str], columns: list[str]) -> exp.Expression:
    """Table names → lake identifiers (aliases kept so qualified columns still bind); INSERT column
    lists become output aliases."""
    q = query.copy()

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and table_name(node) in mapping:
            new = exp.to_table(mapping[table_name(node)])
            alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(node.name))
            if mapping[table_name(node)].split(".")[-1] != node.name or node.args.get("alias"):
                new.set("alias", alias)
            return new
        return node

    q = q.transform(swap)
    if columns and isinstance(q, exp.Select):
        if len(columns) != len(q.expressions):
            raise SqlImportError(f"INSERT names {len(columns)} columns but the SELECT produces {len(q.expressions)}")
        q.set("expressions", [exp.alias_(e.unalias() if isinstance(e, exp.Alias) else e, c)
                              for e, c in zip(q.expressions, columns, strict=True)])
    return q


def _validate_merged(catalog: MetadataCatalog, res: ImportResult, file_name: str) -> None:
    rows: dict[str, list] = {}
    for section in SECTIONS:
        by_key = {e.key(): (e, Origin("control-db", f"{section}{list(e.key())}")) for e in getattr(catalog, section)}
        for j, e in enumerate(getattr(res, section, []) if hasattr(res, section) else []):
            by_key[e.key()] = (e, Origin(file_name, f"{section}[{j}]"))
        rows[section] = list(by_key.values())
    try:
        build_catalog(rows)
    except MetadataError as exc:
        raise SqlImportError(f"{file_name}: the imported metadata would not apply:\n  " + "\n  ".join(exc.problems)) from exc


def layers() -> tuple[str, ...]:
    return LAYERS
