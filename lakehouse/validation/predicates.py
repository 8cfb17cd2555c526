"""Row rules written once: every row rule kind is ONE SQL boolean predicate, built here with
sqlglot's expression builders (identifiers quoted, values as typed literals, never pasted into
text), in Spark SQL's semantics, the platform's reference dialect. Each engine only renders it:

* Spark evaluates `tree.sql(dialect="spark")` with `F.expr` (lakehouse.validation.rules);
* the Arrow engine evaluates every row rule of a batch in one DuckDB query over the Arrow table
  (lakehouse.engines.arrow.rules), the tree translated by `lakehouse.sql.parse.condition_to_duckdb`,
  the same translation `expression` rules go through (Spark's answers where DuckDB's differ).

A predicate is TRUE when the row passes; NULL never escapes (`COALESCE(..., FALSE)`: a NULL value
fails every rule but `not_null` on another column). A new row rule kind is one more branch of
`row_predicate`; its outcome and message are `lakehouse.validation.rules.row_outcome`, shared too.
`freshness` is written here too: the instant a column holds (`instant`, whose newest both engines
take) and its stale rows (`stale_predicate`); its outcome is `rules.freshness_outcome`.

What stays per engine, because the engines' semantics force it:

* `regex`: Spark matches with Java's `java.util.regex` (`RLIKE`, a find anywhere in the text),
  DuckDB with RE2 (`regexp_matches`, also a find). Patterns in their common subset (no
  backreferences, lookaround or possessive quantifiers: RE2 refuses them and the rule ends in
  error on the Arrow engine) match the same rows. The text a non-string value is matched as is
  Spark's `CAST(x AS STRING)`; DuckDB spells doubles, decimals and zoned timestamps otherwise
  ('nan' / 'NaN', '1e+20' / '1.0E20', a '+00' suffix), so the Arrow engine passes `text_of` to
  put its own Spark spelling of the column in place of the cast (`arrow.rules._spark_string`).
* `expression`: the author's Spark SQL. Spark runs the text as written (and checks its type and
  determinism on its own plan); DuckDB gets `condition_to_duckdb` of the same parsed tree.
* how a predicate's failing rows are counted, tagged and sampled: Spark's aggregates (with the
  Iceberg file statistics and observed metrics of `RowPass`), pyarrow over DuckDB's flags.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlglot import exp

if TYPE_CHECKING:
    from lakehouse.metadata.model import Rule


class RuleError(ValueError):
    """A rule that cannot be evaluated as written (bad expression, unknown column, bad type)."""


def column(name: str) -> exp.Column:
    """A quoted column reference (any name, any case: both engines resolve it case-insensitively)."""
    return exp.column(name, quoted=True)


def literal(value: Any) -> exp.Expression:
    """A metadata value as a typed SQL literal, as Spark's `F.lit` types it: a bool is BOOLEAN, an
    int an integer, a float DOUBLE (not the DECIMAL a bare `0.5` is in Spark SQL), the rest a string."""
    if value is None:
        return exp.null()
    if isinstance(value, bool):
        return exp.true() if value else exp.false()
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, float):
        return exp.cast(exp.Literal.string(repr(value)), "double")
    return exp.Literal.string(str(value))


def require_columns(columns: list[str], rule: Rule, names: list[str]) -> None:
    have = {c.lower() for c in columns}
    missing = [n for n in names if n.lower() not in have]
    if missing:
        raise RuleError(f"rule {rule.name!r}: column(s) {missing} not in the dataset (columns: {sorted(columns)})")


def check_expression(expression: str, rule_name: str = "?") -> exp.Expression:
    """The parsed tree of an `expression` rule: a single scalar boolean-looking expression, no
    statement, subquery, aggregate, window or second statement smuggled in after a `;`."""
    import sqlglot

    where = f"rule {rule_name!r}: expression {expression!r}"
    try:
        trees = [t for t in sqlglot.parse(expression, read="spark") if t is not None]
    except sqlglot.errors.ParseError as exc:
        err = exc.errors[0] if exc.errors else {}
        raise RuleError(f"{where} does not parse as Spark SQL: {err.get('description', 'syntax error')} "
                        f"at column {err.get('col', '?')}") from exc
    if len(trees) != 1:
        raise RuleError(f"{where} must be one expression, found {len(trees)} statements")
    tree = trees[0]
    if not isinstance(tree, exp.Condition) or tree.find(exp.Subquery, exp.Select, exp.Query):
        raise RuleError(f"{where} must be a boolean expression, not a statement or subquery")
    if tree.find(exp.AggFunc, exp.Window):
        raise RuleError(f"{where} must be a row-level expression (no aggregates or windows)")
    return tree


def _spark_text(name: str) -> exp.Expression:
    return exp.cast(column(name), "string")


def row_predicate(rule: Rule, columns: list[str],
                  text_of: Callable[[str], exp.Expression] = _spark_text) -> exp.Expression:
    """TRUE when a row passes the row rule `rule` (never NULL: a NULL answer fails), over a frame
    of `columns`. `text_of(column)`: the expression spelling the column's values as Spark's
    CAST(... AS STRING) does (what a regex matches). RuleError when the rule cannot be evaluated
    on these columns."""
    tree = passes_or_null(rule, columns, text_of)
    if rule.type == "not_null":  # never NULL already
        return tree
    return exp.func("coalesce", exp.paren(tree, copy=False), exp.false())


def passes_or_null(rule: Rule, columns: list[str],
                   text_of: Callable[[str], exp.Expression] = _spark_text) -> exp.Expression:
    """`row_predicate` before NULL is made FALSE (an engine that fills NULLs itself, and names an
    `expression` of another type than boolean, evaluates this)."""
    if rule.type == "not_null":
        require_columns(columns, rule, rule.columns)
        return exp.and_(*[column(c).is_(exp.null()).not_() for c in rule.columns])
    if rule.type == "expression":
        return check_expression(rule.expression or "", rule.name)
    if not rule.column:
        raise RuleError(f"rule {rule.name!r} of type {rule.type} needs column")
    require_columns(columns, rule, [rule.column])
    col = column(rule.column)
    if rule.type == "accepted_values":
        return col.isin(*[literal(v) for v in rule.values]) if rule.values else exp.false()
    if rule.type == "range":
        bounds = ([col >= literal(rule.min)] if rule.min is not None else []) + \
                 ([col.copy() <= literal(rule.max)] if rule.max is not None else [])
        return exp.and_(*bounds) if bounds else exp.true()
    if rule.type == "regex":
        return exp.RegexpLike(this=text_of(rule.column), expression=exp.Literal.string(rule.pattern or ""))
    raise RuleError(f"rule {rule.name!r}: {rule.type} is not a row rule")


def instant(name: str) -> exp.Expression:
    """The column read as an instant, as Spark's CAST(... AS TIMESTAMP) reads it (a date or a
    naive timestamp at the session time zone): what `freshness` takes the newest of."""
    return exp.cast(column(name), "timestamp")


def stale_predicate(rule: Rule, columns: list[str], cutoff: dt.datetime) -> exp.Expression:
    """TRUE for a row of a `freshness` rule older than `cutoff` (naive UTC), or with no instant."""
    require_columns(columns, rule, [rule.column])
    at = exp.cast(exp.Literal.string(cutoff.replace(tzinfo=dt.UTC).isoformat(sep=" ")), "timestamp")
    return exp.func("coalesce", exp.paren(instant(rule.column) < at, copy=False), exp.true())
