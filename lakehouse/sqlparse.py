"""SQL → metadata: upstream tables of a transformation, derived with sqlglot so nobody writes deps twice."""

from __future__ import annotations

import functools
import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, SqlglotError, TokenError

DIALECT = "spark"


class SqlParseError(ValueError):
    """SQL that sqlglot cannot parse (or that is not what its place allows); the message carries
    line and column in words, and `line` / `col` / `reason` carry them for callers that name a file."""

    def __init__(self, message: str, line: int | None = None, col: int | None = None, reason: str | None = None):
        super().__init__(message)
        self.line, self.col, self.reason = line, col, reason or message


def _friendly(desc: str, highlight: str) -> str:
    """sqlglot's parser message in plain words (no class names or token dumps)."""
    near = f" {highlight!r}" if highlight else ""
    if desc.startswith("Required keyword"):
        return f"incomplete SQL: something is missing after{near or ' this point'}"
    if desc.startswith("Expecting )"):
        return f"expected ')' near{near or ' the end'}: a parenthesis is not closed"
    if desc.startswith("Invalid expression / Unexpected token"):
        return f"unexpected{near or ' text'}"
    desc = re.sub(r"\s*<(?:Token|class) [^>]*>", "", desc).rstrip()
    if desc.endswith(" but got"):
        desc += " the end of the statement"
    return desc


def error_position(text: str, exc: ParseError | TokenError) -> tuple[int | None, int | None, str]:
    """(line, column, reason in plain words) of a sqlglot parse or tokenizer error in `text`."""
    if isinstance(exc, ParseError) and exc.errors:
        e = exc.errors[0]
        return e.get("line"), e.get("col"), _friendly(e.get("description") or str(exc), e.get("highlight") or "")
    cause = str(exc.__cause__ or exc)
    m = re.search(r"^(.*) from (\d+):(\d+)", cause)
    if m:  # the tokenizer's "Missing ' from L:C": clamp the column into the line it names
        line = int(m.group(2))
        lines = text.splitlines() or [""]
        body = lines[min(line, len(lines)) - 1]
        col = int(m.group(3))
        if col > len(body) + 1:
            col = max(body.rfind(m.group(1)[-1]), 0) + 1
        return line, col, f"{m.group(1).lower()} (a quote is not closed)"
    return None, None, cause


def parse_statements(sql: str, dialect: str = DIALECT) -> list[exp.Expression]:
    """Every statement of `sql`; a syntax error raises SqlParseError with line and column."""
    try:
        return [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except (ParseError, TokenError) as exc:
        line, col, desc = error_position(sql, exc)
        raise SqlParseError(f"cannot parse SQL at line {line}, column {col}: {desc}", line, col, desc) from exc


def parse_one(sql: str, dialect: str = DIALECT) -> exp.Expression:
    statements = parse_statements(sql, dialect)
    if len(statements) != 1:
        raise SqlParseError(f"expected one SQL statement, found {len(statements)}")
    return statements[0]


def parse_query(sql: str, dialect: str = DIALECT) -> exp.Query:
    """Exactly one query (SELECT, WITH … SELECT, a set operation, VALUES): what a stage may hold.

    A second statement, or a statement that is not a query (DROP, INSERT, CREATE, SET …), is an
    error naming what was found, because the runner runs the text and writes what it returns."""
    statements = parse_statements(sql, dialect)
    if len(statements) != 1:
        kinds = ", ".join(_kind(s) for s in statements) or "nothing"
        line = _second_statement_line(sql) if statements else None
        raise SqlParseError(f"holds {len(statements)} statements ({kinds}); a stage's SQL must be exactly one "
                            "query: remove the others or split them into stages", line, 1 if line else None,
                            f"{len(statements)} statements")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        line = _first_line(sql)
        kind = _kind(tree)
        raise SqlParseError(f"is {'an' if kind[0] in 'AEIOU' else 'a'} {kind} statement, not a query; a stage's SQL must be one SELECT (or "
                            "WITH … SELECT) producing the target's rows — the platform writes the table itself",
                            line, 1, f"{kind} statement")
    return tree


@functools.lru_cache(maxsize=4096)
def _query_or_error(sql: str, dialect: str) -> tuple[exp.Query | None, SqlParseError | None]:
    try:
        return parse_query(sql, dialect), None
    except SqlParseError as exc:
        return None, exc


def shared_query(sql: str, dialect: str = DIALECT) -> exp.Query:
    """`parse_query`, parsed once per text and shared: callers must not modify the tree (copy it,
    or call parse_query, to rewrite). Validation looks at each stage's SQL several times."""
    tree, err = _query_or_error(sql, dialect)
    if err is not None:
        raise SqlParseError(str(err), err.line, err.col, err.reason)
    return tree


def _kind(tree: exp.Expression) -> str:
    if isinstance(tree, exp.Query):
        return "SELECT"
    if isinstance(tree, exp.Command):
        return str(tree.this).upper()
    return tree.key.upper()


def _tokens(sql: str) -> list:
    try:
        return sqlglot.tokenize(sql, read=DIALECT)
    except TokenError:
        return []


def _first_line(sql: str) -> int:
    """The line of the first statement token (comments and blank lines skipped)."""
    tokens = _tokens(sql)
    return tokens[0].line if tokens else 1


def _second_statement_line(sql: str) -> int | None:
    """The line where the second statement starts (the first token after a ';')."""
    from sqlglot.tokens import TokenType

    tokens = _tokens(sql)
    for i, t in enumerate(tokens[:-1]):
        if t.token_type == TokenType.SEMICOLON:
            return tokens[i + 1].line
    return None


def table_name(table: exp.Table) -> str:
    """db.table (the catalog part, if any, is dropped: every table lives in the lake catalog)."""
    parts = [p for p in (table.db, table.name) if p]
    return ".".join(parts).lower()


def tables_in_sql(sql: str, dialect: str = DIALECT) -> list[str]:
    """Tables read by a statement, in first-seen order, excluding CTE names and the write target."""
    return tables_in_tree(parse_one(sql, dialect))


def tables_in_tree(tree: exp.Expression) -> list[str]:
    """`tables_in_sql` of an already parsed statement."""
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


# --------------------------------------------------------------------------- Spark SQL on DuckDB


class DuckdbSqlError(ValueError):
    """Spark SQL that cannot run on DuckDB as written (the message says what and how to fix it)."""


def to_duckdb(sql: str) -> str:
    """`sql` (Spark SQL) in DuckDB's dialect; raises DuckdbSqlError for what does not carry over."""
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except SqlglotError as exc:
        raise DuckdbSqlError(f"cannot parse the SQL: {str(exc).splitlines()[0]}") from exc
    return _duckdb_text(tree)


#: functions that answer differently on every evaluation: Spark refuses them in a rule (its failing
#: rows could not be counted), so the DuckDB evaluation of a rule does too
_NONDETERMINISTIC = (exp.Rand, exp.Randn, exp.Uuid, exp.Shuffle)


def expression_to_duckdb(expression: str) -> str:
    """A rule's Spark SQL boolean expression in DuckDB's dialect (the Arrow engine evaluates
    `expression` rules in DuckDB over the batch); DuckdbSqlError for what does not carry over."""
    try:
        tree = sqlglot.parse_one(expression, read=DIALECT, into=exp.Condition)
    except SqlglotError as exc:
        raise DuckdbSqlError(f"cannot parse the expression: {str(exc).splitlines()[0]}") from exc
    varying = sorted({type(n).__name__.lower() for n in tree.find_all(*_NONDETERMINISTIC)})
    if varying:
        raise DuckdbSqlError(f"{', '.join(varying)}() answer differently on every evaluation, so the failing rows "
                             "cannot be counted")
    return _duckdb_text(tree, "set the target's engine to spark")


def expression_problem(expression: str) -> str | None:
    """Why a rule's expression cannot be evaluated in DuckDB, or None."""
    try:
        expression_to_duckdb(expression)
    except DuckdbSqlError as exc:
        return str(exc)
    return None


def _duckdb_text(tree: exp.Expression, fallback: str = "set sql_engine: spark") -> str:
    unknown = sorted({f.name for f in tree.find_all(exp.Anonymous)})
    if unknown:  # sqlglot passes unknown functions through by name: DuckDB may lack them or differ
        raise DuckdbSqlError(
            f"function(s) {', '.join(unknown)} have no known DuckDB equivalent (sqlglot does not translate "
            f"them); rewrite with standard functions or {fallback}")
    try:
        return tree.sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)
    except SqlglotError as exc:
        raise DuckdbSqlError(f"does not transpile from Spark SQL to DuckDB: {str(exc).splitlines()[0]}; "
                             f"rewrite it or {fallback}") from exc


def duckdb_problem(sql: str) -> str | None:
    """Why `sql` cannot run on DuckDB, or None (the static check of `sql_engine: duckdb`)."""
    try:
        to_duckdb(sql)
    except DuckdbSqlError as exc:
        return str(exc)
    return None
