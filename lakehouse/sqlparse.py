"""SQL → metadata: upstream tables of a transformation, derived with sqlglot so nobody writes deps twice."""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

DIALECT = "spark"


class SqlParseError(ValueError):
    """SQL that sqlglot cannot parse; the message carries line and column."""


def parse_one(sql: str, dialect: str = DIALECT) -> exp.Expression:
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as exc:
        err = exc.errors[0] if exc.errors else {}
        line, col = err.get("line"), err.get("col")
        desc = err.get("description", str(exc))
        raise SqlParseError(f"cannot parse SQL at line {line}, column {col}: {desc}") from exc
    if len(statements) != 1:
        raise SqlParseError(f"expected one SQL statement, found {len(statements)}")
    return statements[0]


def table_name(table: exp.Table) -> str:
    """db.table (the catalog part, if any, is dropped: every table lives in the lake catalog)."""
    parts = [p for p in (table.db, table.name) if p]
    return ".".join(parts).lower()


def tables_in_sql(sql: str, dialect: str = DIALECT) -> list[str]:
    """Tables read by a statement, in first-seen order, excluding CTE names and the write target."""
    tree = parse_one(sql, dialect)
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    written: set[str] = set()
    if isinstance(tree, (exp.Create, exp.Insert)):
        tgt = tree.this
        if isinstance(tgt, exp.Schema):
            tgt = tgt.this
        if isinstance(tgt, exp.Table):
            written.add(table_name(tgt))
    out: list[str] = []
    for t in tree.find_all(exp.Table):
        name = table_name(t)
        if not t.name or name in written or (not t.db and name in ctes) or name in out:
            continue
        out.append(name)
    return out


def rewrite_tables(sql: str, mapping: dict[str, str], dialect: str = DIALECT) -> str:
    """Replace table references (db.table, lower-cased) by other names, e.g. snapshot-pinned views."""
    tree = parse_one(sql, dialect)

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and table_name(node) in mapping:
            new = exp.to_table(mapping[table_name(node)], dialect=dialect)
            if node.alias:
                new.set("alias", node.args.get("alias"))
            else:
                new.set("alias", exp.TableAlias(this=exp.to_identifier(node.name)))
            return new
        return node

    return tree.transform(swap).sql(dialect=dialect)
