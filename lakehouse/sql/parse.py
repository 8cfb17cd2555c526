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


#: what a DuckDB SQL stage's author, and a rule's, does instead of what does not carry over
_STAGE_FALLBACK = "set sql_engine: spark"
_RULE_FALLBACK = "set the target's engine to spark"


def to_duckdb(sql: str) -> str:
    """`sql` (Spark SQL) in DuckDB's dialect, answering as Spark would (the rewrites and refusals of
    rule expressions, `expression_to_duckdb`); raises DuckdbSqlError for what does not carry over."""
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except SqlglotError as exc:
        raise DuckdbSqlError(f"cannot parse the SQL: {str(exc).splitlines()[0]}") from exc
    if not isinstance(tree, exp.Query):
        raise DuckdbSqlError(f"is a {_kind(tree)}, not one query: a DuckDB SQL stage's SQL is one SELECT over "
                             "lake tables")
    refuse_external_access(tree)
    _refuse_unknown_functions(tree, _STAGE_FALLBACK)
    _refuse_unnamed_outputs(tree)
    _refuse_divergent(tree, _STAGE_FALLBACK)
    return _duckdb_text(tree, _STAGE_FALLBACK)


#: DuckDB functions (of DuckDB 1.4 and its extensions) that read files, URLs, other databases or
#: secrets, load or list extensions, or show the engine's settings, catalog and environment; and the
#: prefixes of their families. SQL from metadata that DuckDB runs (a `sql_engine: duckdb` stage, a
#: rule on the Arrow engine) reads the run's pinned tables only: such a call is refused here, when the
#: metadata is validated and again when the SQL is transpiled for a run. (The connection itself has
#: external access off, lakehouse.sources.duckdb_sql.connect: this names the call before a run.)
DUCKDB_EXTERNAL_FUNCTIONS = frozenset({
    "glob", "query", "query_table", "current_setting", "getenv", "which_secret", "checkpoint", "force_checkpoint",
    "enable_logging", "disable_logging", "truncate_duckdb_logs", "enable_profile", "disable_profile",
    "in_search_path", "extension_versions", "seq_scan", "summary", "test_all_types", "test_vector_types",
    "python_map_function", "arrow_scan", "arrow_scan_dumb", "pandas_scan", "csv_scan", "json_scan", "icu_calendar_names",
    "pg_timezone_names", "load_extension", "install_extension", "to_file", "copy", "attach", "detach",
})
DUCKDB_EXTERNAL_PREFIXES = ("read_", "duckdb_", "pragma_", "parquet_", "iceberg_", "delta_", "sqlite_", "postgres_",
                            "mysql_", "json_execute", "sniff_", "httpfs", "http_", "s3_", "azure_", "gcs_", "excel_",
                            "st_read", "spatial_", "ducklake_", "uc_", "vss_", "fts_")
#: table functions such SQL may call in FROM: they make rows from their arguments and read nothing
DUCKDB_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest", "explode", "posexplode", "inline", "stack"})
#: a table name DuckDB takes for a table, never for a file (`FROM 'data.csv'` reads the file)
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _function_name(node: exp.Func) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def external_access(tree: exp.Expression) -> str | None:
    """What in `tree` (parsed Spark SQL that DuckDB will run) reads outside the tables it is given,
    or None: a file, URL, database, extension or settings function anywhere, a table function in FROM
    that is not a row generator, or a table named like a file (DuckDB reads `FROM 'x.csv'`)."""
    for fn in tree.find_all(exp.Func):
        name = _function_name(fn)
        if name in DUCKDB_EXTERNAL_FUNCTIONS or name.startswith(DUCKDB_EXTERNAL_PREFIXES):
            return (f"calls {name}(), which reads files, URLs, extensions or settings outside the run's tables: "
                    "SQL that DuckDB runs reads lake tables only. Fix: read the data through a source and a stage")
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        if isinstance(table.this, exp.Func):
            name = _function_name(table.this)
            if name not in DUCKDB_TABLE_FUNCTIONS:
                return (f"reads FROM the table function {name}(): SQL that DuckDB runs reads lake tables (and "
                        f"the row generators {', '.join(sorted(DUCKDB_TABLE_FUNCTIONS))}) only")
            continue
        parts = [p.name for p in table.parts]
        if parts and parts[-1].lower() in ctes and len(parts) == 1:
            continue
        odd = next((p for p in parts if not _PLAIN_NAME.match(p)), None)
        if odd is not None:
            return (f"reads FROM {table.sql(dialect=DIALECT)}, a name DuckDB may take for a file or URL ({odd!r} "
                    "is not a plain identifier): SQL that DuckDB runs reads lake tables only")
    return None


def refuse_external_access(tree: exp.Expression) -> None:
    """DuckdbSqlError naming what in `tree` reads outside its tables (`external_access`)."""
    problem = external_access(tree)
    if problem:
        raise DuckdbSqlError(problem)


def _refuse_unknown_functions(tree: exp.Expression, fallback: str) -> None:
    unknown = sorted({f.name for f in tree.find_all(exp.Anonymous)})
    if unknown:  # sqlglot passes unknown functions through by name: DuckDB may lack them or differ
        raise DuckdbSqlError(
            f"function(s) {', '.join(unknown)} have no known DuckDB equivalent (sqlglot does not translate "
            f"them); rewrite with standard functions or {fallback}")


def _refuse_unnamed_outputs(tree: exp.Expression) -> None:
    """A result column that is an expression without an alias is named by each engine its own way
    (`count(*)` is `count(1)` on Spark, `count_star()` on DuckDB), and a rewrite for Spark's answers
    would rename it again: the stage's table would get other columns on DuckDB. Refused, naming it."""
    select = tree
    while isinstance(select, exp.SetOperation):  # a UNION's columns are named by its first SELECT
        select = select.this
    if not isinstance(select, exp.Select):
        return
    for column in select.expressions:
        if not isinstance(column, (exp.Alias, exp.Column, exp.Star)):
            raise DuckdbSqlError(f"result column {column.sql(dialect=DIALECT)!r} has no name: give it one "
                                 f"(`... AS name`): Spark and DuckDB name such a column differently, or {_STAGE_FALLBACK}")


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
    return condition_to_duckdb(tree).sql(dialect="duckdb")


def condition_to_duckdb(tree: exp.Expression) -> exp.Expression:
    """A row-level condition in Spark SQL's semantics (a rule's predicate,
    lakehouse.validation.predicates) as a tree DuckDB answers as Spark does, to be rendered with
    `.sql(dialect="duckdb")`; DuckdbSqlError for what does not carry over (and for a file, URL,
    setting or extension function: `refuse_external_access`)."""
    refuse_external_access(tree)
    varying = sorted({type(n).__name__.lower() for n in tree.find_all(*_NONDETERMINISTIC)})
    if varying:
        raise DuckdbSqlError(f"{', '.join(varying)}() answer differently on every evaluation, so the failing rows "
                             "cannot be counted")
    _refuse_divergent(tree, _RULE_FALLBACK)
    _refuse_unknown_functions(tree, _RULE_FALLBACK)
    tree = _as_spark_answers(tree, _RULE_FALLBACK)
    try:
        tree.sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)
    except SqlglotError as exc:
        raise DuckdbSqlError(f"does not transpile from Spark SQL to DuckDB: {str(exc).splitlines()[0]}; "
                             f"rewrite it or {_RULE_FALLBACK}") from exc
    return tree


#: casts whose answer Spark (ANSI off) and DuckDB give differently for some input type, which a rule
#: does not declare: to an integer Spark truncates a fraction (CAST('1.5' AS INT) = 1, 2.5 -> 2, a
#: decimal 1.50 -> 1), wraps a bigint (9223372036854775807 -> -1), saturates a double (NaN -> 0,
#: inf -> 2147483647) and refuses an exponent ('1e3' -> NULL); DuckDB rounds, answers NULL and reads
#: '1e3' as 1000. To a string Spark writes a double as 'NaN', 'Infinity', '1.0E308'; DuckDB as 'nan',
#: 'inf', '1e+308'. (tests/test_expression_parity.py found each of these.)
_DIVERGENT_CASTS = {
    exp.DataType.Type.TINYINT: "an integer", exp.DataType.Type.SMALLINT: "an integer",
    exp.DataType.Type.INT: "an integer", exp.DataType.Type.BIGINT: "an integer",
    exp.DataType.Type.TEXT: "a string", exp.DataType.Type.VARCHAR: "a string", exp.DataType.Type.CHAR: "a string",
}

_CAST_WHY = {
    "an integer": "Spark truncates '1.5' and 1.5 to 1, wraps a bigint, saturates a double and reads '1e3' as NULL; "
                  "DuckDB rounds to 2 and reads 1000: compare without the cast (x >= 1 rather than CAST(x AS INT) "
                  ">= 1) or cast to DOUBLE or DECIMAL",
    "a string": "Spark writes a double as 'NaN', 'Infinity', '1.0E308', DuckDB as 'nan', 'inf', '1e+308': compare "
                "the value itself, or format a date with date_format",
}

#: functions DuckDB answers otherwise: sign(NaN) is NaN on Spark (greater than any number), 1 on
#: DuckDB; unix_timestamp(ts) does not bind on DuckDB (a timestamp is not parsed as text there);
#: initcap() splits words and maps case otherwise; nanvl() does not exist on DuckDB; `a div b`
_DIVERGENT_FUNCTIONS = {exp.Sign: "sign()/signum() of NaN", exp.StrToUnix: "unix_timestamp()/to_unix_timestamp()",
                        exp.Initcap: "initcap() (word boundaries and Unicode case mapping)",
                        exp.Nanvl: "nanvl() (no DuckDB function)",
                        exp.IntDiv: "div (Spark truncates a double or decimal operand to an integer first; DuckDB's // "
                                    "of doubles does not)"}

#: Spark's trunc() / date_trunc() unit names DuckDB does not know, as DuckDB spells them
_TRUNC_UNITS = {"YYYY": "year", "YY": "year", "MM": "month", "MON": "month", "DD": "day"}


def _refuse_divergent(tree: exp.Expression, fallback: str) -> None:
    """DuckdbSqlError for a construct whose DuckDB answer differs from Spark's for some value."""
    for cast in tree.find_all(exp.Cast):  # TryCast is a Cast
        kind = _DIVERGENT_CASTS.get(cast.to.this)
        if kind:
            raise DuckdbSqlError(f"CAST(... AS {cast.to.sql(dialect=DIALECT)}) answers differently on DuckDB for some "
                                 f"values ({_CAST_WHY[kind]}); {fallback}")
    for node_type, what in _DIVERGENT_FUNCTIONS.items():
        if tree.find(node_type):
            raise DuckdbSqlError(f"{what} answers differently on DuckDB; rewrite it or {fallback}")


def _as_spark_answers(tree: exp.Expression, fallback: str) -> exp.Expression:
    """`tree` rewritten so DuckDB answers as Spark (ANSI off) does where sqlglot's translation does
    not: a failing cast is NULL (int(s), to_timestamp(s) are CASTs in sqlglot's tree), DuckDB's
    infinite dates and timestamps ('infinity' cast) are NULL, dayofweek is 1 (Sunday) to 7, substr's
    position 0 is 1 and a start before the string shortens the slice, left/right of a length <= 0
    is '', size(NULL) is -1, x % 0 is NULL, ceil / floor are a BIGINT, sqrt of a negative is NaN
    and a logarithm of a number <= 0 is NULL (DuckDB raises on both), trunc()'s unit names are DuckDB's, and upper()/lower() of a character
    Spark cases otherwise (ß -> SS) raise: a named rule error, never a silently different count."""
    tree = tree.copy()
    for node in reversed(list(tree.walk(bfs=False))):  # children before parents: a rewrite copies fixed children
        new = _spark_answer(node, fallback)
        if new is not node:
            if node is tree:
                tree = new
            else:
                node.replace(new)
    return tree


#: characters whose upper case is more than one character on Spark (Java's String.toUpperCase, from
#: Unicode's SpecialCasing: ß -> SS, ligatures, Greek with ypogegrammeni ...) and one on DuckDB
#: (utf8proc's simple mapping); a superset of the ranges, to err on the loud side
_UPPER_EXPANDS = "\u00df\u0149\u01f0\u0390\u03b0\u0587\u1e96-\u1e9a\u1f50-\u1f56\u1f80-\u1ffc\ufb00-\ufb17"
#: characters Java lower-cases otherwise: İ -> i + combining dot, Σ -> ς at a word's end
_LOWER_DIFFERS = "\u0130\u03a3"

_TIMES = (exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ,
          exp.DataType.Type.TIMESTAMPLTZ)


def _spark_answer(node: exp.Expression, fallback: str) -> exp.Expression:
    if isinstance(node, exp.TsOrDsToDate) and not node.args.get("format"):
        node = exp.TryCast(this=node.this, to=exp.DataType.build("date"))
    if isinstance(node, exp.Cast):  # TryCast too
        to = node.to
        if to.this == exp.DataType.Type.TIMESTAMP:  # to_timestamp(s): Spark's TIMESTAMP is zoned
            to = exp.DataType.build("timestamptz")
        cast = exp.TryCast(this=node.this, to=to)
        if to.this in _TIMES:
            return exp.Case(ifs=[exp.If(this=exp.func("isfinite", cast.copy()), true=cast)])
        return cast
    if isinstance(node, exp.DayOfWeek):
        return exp.Paren(this=exp.Add(this=node.copy(), expression=exp.Literal.number(1)))
    if isinstance(node, exp.Substring):
        return _spark_substring(node)
    if isinstance(node, (exp.Left, exp.Right)) and _whole_number(node.expression) < 0:
        # Spark: a length <= 0 is ''; DuckDB's left('abc', -1) is 'ab'
        n, text = node.expression, node.this
        return exp.Case(ifs=[exp.If(this=exp.Or(this=exp.Is(this=text.copy(), expression=exp.Null()),
                                                expression=exp.Is(this=n.copy(), expression=exp.Null())),
                                    true=exp.Null()),
                             exp.If(this=exp.LTE(this=n.copy(), expression=exp.Literal.number(0)),
                                    true=exp.Literal.string(""))], default=node.copy())
    if isinstance(node, exp.Mod):  # Spark: x % 0 is NULL for every type; DuckDB: NaN for a double
        node.set("expression", exp.Nullif(this=node.expression.copy(), expression=exp.Literal.number(0)))
        return node
    if isinstance(node, (exp.Ceil, exp.Floor)) and not node.args.get("decimals"):
        return _spark_ceil_floor(node)
    if isinstance(node, exp.ArraySize):
        return exp.Case(ifs=[exp.If(this=exp.Is(this=node.this.copy(), expression=exp.Null()),
                                    true=exp.Literal.number(-1))], default=node.copy())
    if isinstance(node, exp.Sqrt):
        x = node.this
        return exp.Sqrt(this=exp.Case(ifs=[exp.If(this=exp.LT(this=x.copy(), expression=exp.Literal.number(0)),
                                                  true=_nan())], default=x.copy()))
    if isinstance(node, (exp.Ln, exp.Log)):
        arg = "this" if isinstance(node, exp.Ln) else "expression"
        x = node.args[arg]
        node.set(arg, exp.Case(ifs=[exp.If(this=exp.GT(this=x.copy(), expression=exp.Literal.number(0)),
                                           true=x.copy())]))
        return node
    if isinstance(node, (exp.DateTrunc, exp.TimestampTrunc)):
        unit = node.args.get("unit")
        if unit is not None and unit.name.upper() in _TRUNC_UNITS:
            node.set("unit", exp.Literal.string(_TRUNC_UNITS[unit.name.upper()]))
        return node
    if isinstance(node, (exp.Upper, exp.Lower)):
        name, chars = ("upper", _UPPER_EXPANDS) if isinstance(node, exp.Upper) else ("lower", _LOWER_DIFFERS)
        special = exp.RegexpLike(this=node.this.copy(), expression=exp.Literal.string(f"[{chars}]"))
        message = exp.Literal.string(f"{name}() of a character Spark maps by Unicode's special casing (upper('ß') "
                                     "is 'SS', lower('Σ') at a word's end is 'ς' on Spark, one character on "
                                     f"DuckDB); {fallback}")
        return exp.Case(ifs=[exp.If(this=special, true=exp.func("error", message))], default=node.copy())
    return node


def _spark_ceil_floor(node: exp.Expression) -> exp.Expression:
    """ceil / floor are a BIGINT on Spark (DuckDB: a DOUBLE for an integer or double, so the
    arithmetic around them differs), NaN gives 0 and ±inf or a double beyond the range the
    BIGINT limits (Scala's Double.toLong)."""
    template = ("CASE WHEN __lh_x IS NULL THEN NULL WHEN ISNAN(CAST(__lh_x AS DOUBLE)) THEN 0 "
                "WHEN CAST(__lh_x AS DOUBLE) >= 9223372036854775807 THEN CAST(9223372036854775807 AS BIGINT) "
                "WHEN CAST(__lh_x AS DOUBLE) <= -9223372036854775808 THEN CAST(-9223372036854775808 AS BIGINT) "
                f"ELSE CAST({'CEIL' if isinstance(node, exp.Ceil) else 'FLOOR'}(__lh_x) AS BIGINT) END")
    x = node.this

    def fill(n: exp.Expression) -> exp.Expression:
        return exp.Paren(this=x.copy()) if isinstance(n, exp.Column) and n.name == "__lh_x" and not n.table else n

    return sqlglot.parse_one(template, read="duckdb").transform(fill)


def _whole_number(node: exp.Expression) -> int:
    """The value of an integer literal, -1 for anything else."""
    return int(node.name) if isinstance(node, exp.Literal) and not node.is_string and node.name.isdigit() else -1


def _nan() -> exp.Expression:
    return exp.Cast(this=exp.Literal.string("NaN"), to=exp.DataType.build("double"))


def _spark_substring(node: exp.Substring) -> exp.Expression:
    """substr(s, pos[, len]) with Spark's reading of pos (UTF8String.substringSQL): pos > 0 counts
    from 1, pos 0 is 1, pos < 0 counts from the end; the slice [start, start + len) is cut to the
    string, so substr('ABC', -5, 3) is 'A', and a negative len gives '' (DuckDB counts to the left)."""
    s, pos, length = node.this, node.args.get("start"), node.args.get("length")
    if pos is None or (_whole_number(pos) > 0 and (length is None or _whole_number(length) >= 0)):
        return node  # both read a positive position and a length >= 0 alike
    start = "CASE WHEN {p} > 0 THEN {p} - 1 WHEN {p} < 0 THEN LENGTH({s}) + {p} ELSE 0 END"
    text = (f"CASE WHEN {{s}} IS NULL OR {{p}} IS NULL THEN NULL ELSE SUBSTRING({{s}}, GREATEST({start}, 0) + 1) END"
            if length is None else
            f"CASE WHEN {{s}} IS NULL OR {{p}} IS NULL OR {{n}} IS NULL THEN NULL "
            f"WHEN GREATEST({start}, 0) >= ({start}) + {{n}} THEN '' "
            f"ELSE SUBSTRING({{s}}, GREATEST({start}, 0) + 1, ({start}) + {{n}} - GREATEST({start}, 0)) END")
    holes = {"s": s, "p": pos, "n": length}
    template = sqlglot.parse_one(text.format(s="__lh_s", p="__lh_p", n="__lh_n"), read="duckdb")

    def fill(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.name.startswith("__lh_") and not n.table:
            return exp.Paren(this=holes[n.name.removeprefix("__lh_")].copy())
        return n

    return template.transform(fill)


def expression_problem(expression: str) -> str | None:
    """Why a rule's expression cannot be evaluated in DuckDB, or None."""
    try:
        expression_to_duckdb(expression)
    except DuckdbSqlError as exc:
        return str(exc)
    return None


def _duckdb_text(tree: exp.Expression, fallback: str) -> str:
    """DuckDB's text of `tree` (checked for unknown functions by the caller: the rewrite for Spark's
    answers calls DuckDB functions sqlglot does not know), rewritten to answer as Spark."""
    tree = _as_spark_answers(tree, fallback)
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
