"""Column-level lineage of a transformation, derived from its SQL with sqlglot's lineage module.

The result is keyed by upstream table, so it maps directly onto `dataset_lineage.column_lineage`
(one row per upstream edge) and onto DataHub FineGrainedLineage / Dagster TableColumnLineage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.lineage import lineage as sqlglot_lineage

from lakehouse.sql.parse import DIALECT, SqlParseError, parse_one, table_name


@dataclass
class ColumnLineage:
    """For every output column, the (table, column) pairs it is computed from."""

    columns: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: output columns whose lineage could not be resolved (e.g. SELECT * without a schema)
    unresolved: list[str] = field(default_factory=list)

    def by_upstream(self) -> dict[str, dict[str, list[str]]]:
        """{upstream table: {output column: [upstream columns]}}; the shape of dataset_lineage."""
        out: dict[str, dict[str, list[str]]] = {}
        for col, sources in self.columns.items():
            for table, src_col in sources:
                cols = out.setdefault(table, {}).setdefault(col, [])
                if src_col not in cols:
                    cols.append(src_col)
        return out

    def upstream_columns(self, column: str) -> list[str]:
        return [c for _, c in self.columns.get(column, [])]


def select_of(tree: exp.Expression) -> exp.Expression:
    """The query of a CREATE TABLE AS / INSERT INTO ... SELECT, or the statement itself."""
    if isinstance(tree, (exp.Create, exp.Insert)):
        q = tree.expression
        if q is None:
            raise SqlParseError("the statement has no SELECT to derive lineage from")
        return q
    return tree


def column_lineage(sql: str | exp.Expression, schema: Mapping | None = None,
                   dialect: str = DIALECT) -> ColumnLineage:
    """Lineage of every output column of `sql` (a SELECT, CTAS or INSERT ... SELECT).

    `schema` ({db: {table: {column: type}}}) lets `SELECT *` expand; without it star columns
    are reported as unresolved instead of guessed.
    """
    tree = parse_one(sql, dialect) if isinstance(sql, str) else sql
    query = select_of(tree)
    result = ColumnLineage()
    try:
        nodes = sqlglot_lineage(None, query, dict(schema or {}), dialect=dialect)
    except SqlglotError as exc:
        raise SqlParseError(f"cannot derive column lineage: {exc}") from exc
    for col, node in nodes.items():
        if col == "*":
            result.unresolved.append(col)
            continue
        sources: list[tuple[str, str]] = []
        for leaf in node.walk():
            if leaf.downstream or not isinstance(leaf.expression, exp.Table):
                continue
            src_col = leaf.name.rsplit(".", 1)[-1]
            if src_col == "*":
                result.unresolved.append(col)
                continue
            pair = (table_name(leaf.expression), src_col.lower())
            if pair not in sources:
                sources.append(pair)
        result.columns[col] = sources
    return result


def upstream_column_deps(catalog, stage) -> dict[str, list[tuple[str, str]]]:
    """{output column: [(upstream target_id, column)]} of a SQL stage; {} when not derivable.

    The Dagster layer turns this into `dagster/column_lineage` (TableColumnLineage) metadata.
    """
    if not stage.transformation:
        return {}
    try:
        cl = column_lineage(stage.transformation)
    except SqlParseError:
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    for col, sources in cl.columns.items():
        deps = []
        for ident, src_col in sources:
            t = catalog.target_by_identifier(ident)
            if t is not None and catalog.stage_for_target(t.target_id) is not None:
                deps.append((t.target_id, src_col))
        if deps:
            out[col] = deps
    return out
