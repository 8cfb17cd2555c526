"""Rules evaluated on Arrow tables, with the outcomes and messages of lakehouse.validation.rules.

Row rules are not written here: each is its one predicate of lakehouse.validation.predicates (the
same sqlglot tree Spark evaluates), translated to DuckDB by lakehouse.sql.parse.condition_to_duckdb
and evaluated, all of a batch's row rules in ONE DuckDB query over the Arrow table (`tag_failures`).
Engine-specific here, because the engines' semantics force it: the Spark spelling of a non-string
value a `regex` matches (`_spark_string`: DuckDB spells doubles and zoned timestamps otherwise) and
RE2 instead of Java's regex (the predicates module says which patterns match alike); the counting
of `unique` with pyarrow (its outcome is the shared `unique_outcome`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from lakehouse.validation import predicates
from lakehouse.validation.rules import (
    FAILED_RULES_COLUMN,
    SAMPLE_ROWS,
    ActionCounts,
    CheckOutcome,
    RuleError,
    acting_rules,
    action_outcome,
    dataset_rule,
    describe,
    freshness_cutoff,
    freshness_outcome,
    is_fresh,
    label_scopes,
    row_outcome,
    unique_outcome,
)

if TYPE_CHECKING:
    from lakehouse.metadata.model import Rule

#: the name the rows are registered under in the DuckDB connection that evaluates the predicates
_ROWS = "__lh_rows"


def _column(table: pa.Table, rule: Rule, name: str) -> pa.ChunkedArray:
    by_name = {n.lower(): n for n in table.column_names}
    predicates.require_columns(table.column_names, rule, [name])
    return table.column(by_name[name.lower()])


def _spark_string(rule: Rule, col: pa.ChunkedArray, time_zone: str) -> pa.Array:
    """`col` as Spark's `CAST(col AS STRING)` spells it (a regex matches that text): doubles and
    decimals as Java prints them (10.0, NaN, 1.0E20), timestamps as `yyyy-MM-dd HH:mm:ss[.ffffff]` in
    the session time zone (trailing zeros of the fraction dropped)."""
    import zoneinfo

    from lakehouse.engines.arrow.to_json import cast_string

    t = col.type
    if pa.types.is_dictionary(t):
        col, t = col.cast(t.value_type), t.value_type
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return cast_string(col)
    if pa.types.is_timestamp(t):
        zone = zoneinfo.ZoneInfo(time_zone) if t.tz is not None else None

        def spell(v):
            v = v.astimezone(zone) if zone is not None else v
            frac = f"{v.microsecond:06d}".rstrip("0")
            return v.strftime("%Y-%m-%d %H:%M:%S") + (f".{frac}" if frac else "")

        return pa.array([None if v is None else spell(v) for v in col.to_pylist()], pa.string())
    if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        raise RuleError(f"rule {rule.name!r}: a regex over a {t} column is evaluated by Spark; set the target's "
                        "engine to spark")
    return col.cast(pa.string())  # text, integers, booleans, dates: the same spelling as Spark's


class _Rows:
    """The rows as DuckDB sees them: the table's columns, plus Spark's text spelling of the
    non-string columns a regex matches (added on first use)."""

    def __init__(self, table: pa.Table, time_zone: str):
        self.table, self.time_zone = table, time_zone
        self.extra: dict[str, pa.Array] = {}

    def text_of(self, rule: Rule):
        def spell(name: str) -> exp.Expression:
            col = _column(self.table, rule, name)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                return predicates.column(name)
            key = f"__lh_text_{name.lower()}"
            if key not in self.extra:
                self.extra[key] = _spark_string(rule, col, self.time_zone)
            return predicates.column(key)
        return spell

    def relation(self, trees: list[exp.Expression]) -> pa.Table:
        """The columns the predicates name (DuckDB converts only those; any column type may sit beside)."""
        named = {i.name.lower() for t in trees for i in t.find_all(exp.Identifier)}
        keep = [n for n in self.table.column_names if n.lower() in named]
        out = self.table.select(keep)
        for key, arr in self.extra.items():
            if key in named:
                out = out.append_column(key, arr)
        if not out.column_names:  # predicates of literals only: the row count still matters
            out = pa.table({"__lh_row": pa.nulls(self.table.num_rows, pa.bool_())})
        return out


def _predicate(rule: Rule, rows: _Rows) -> exp.Expression:
    """The rule's predicate (without its final COALESCE: NULL is filled in Arrow, and an expression
    of the wrong type is named) as a DuckDB tree."""
    from lakehouse.sql.parse import DuckdbSqlError, condition_to_duckdb

    tree = predicates.passes_or_null(rule, rows.table.column_names, rows.text_of(rule))
    try:
        return condition_to_duckdb(tree)
    except DuckdbSqlError as exc:
        what = f"expression {rule.expression!r}" if rule.type == "expression" else f"{rule.type} rule"
        raise RuleError(f"rule {rule.name!r}: {what} cannot be evaluated without Spark: {exc}") from exc


def _query(relation: pa.Table, trees: list[exp.Expression], time_zone: str) -> pa.Table:
    from lakehouse.sources.duckdb_sql import connect

    select = exp.select(*[exp.alias_(t, f"p{i}", quoted=True) for i, t in enumerate(trees)]).from_(_ROWS)
    con = connect(time_zone)  # one answer per row, in the rows' order; no file or network access
    try:
        con.register(_ROWS, relation)
        return con.execute(select.sql(dialect="duckdb")).fetch_arrow_table()
    finally:
        con.close()


def _fails(rule: Rule, result: pa.ChunkedArray) -> pa.ChunkedArray:
    if not pa.types.is_boolean(result.type):
        raise RuleError(f"rule {rule.name!r}: expression {rule.expression!r} is {result.type}, not boolean")
    return pc.invert(pc.fill_null(result, False))


def _not_valid(rule: Rule, exc: Exception) -> RuleError:
    what = f"expression {rule.expression!r}" if rule.type == "expression" else f"{rule.type} rule"
    return RuleError(f"rule {rule.name!r}: {what} is not valid here: "
                     f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}")


def tag_failures(table: pa.Table, rules: list[Rule], errors: dict[str, str], time_zone: str = "UTC"
                 ) -> dict[str, pa.ChunkedArray]:
    """rule name -> TRUE where the row fails it, for every enabled row rule that can be evaluated
    (the others' errors go to `errors`), as `rules.tag_failures`: every predicate in one DuckDB
    query; when that query fails, each rule on its own, so that only the failing rule errs."""
    import duckdb

    rows = _Rows(table, time_zone)
    planned: dict[str, tuple[Rule, exp.Expression]] = {}
    for r in (r for r in rules if r.enabled and r.is_row_rule):
        try:
            planned[r.name] = r, _predicate(r, rows)
        except RuleError as exc:
            errors[r.name] = str(exc)
    if not planned:
        return {}
    trees = [t for _, t in planned.values()]
    try:
        results = dict(zip(planned, _query(rows.relation(trees), trees, time_zone).columns, strict=True))
    except duckdb.Error:
        results = {}
        for name, (r, tree) in planned.items():
            try:
                results[name] = _query(rows.relation([tree]), [tree], time_zone).column(0)
            except duckdb.Error as exc:
                errors[name] = str(_not_valid(r, exc))
    out = {}
    for name, result in results.items():
        try:
            out[name] = _fails(planned[name][0], result)
        except RuleError as exc:
            errors[name] = str(exc)
    return out


def passes(rule: Rule, table: pa.Table, time_zone: str = "UTC") -> pa.ChunkedArray:
    """TRUE where a row passes the row rule `rule` (NULL counts as failing), as `rules.row_condition`;
    RuleError when it cannot be evaluated."""
    errors: dict[str, str] = {}
    fails = tag_failures(table, [rule.model_copy(update={"enabled": True})], errors, time_zone)
    if rule.name in errors:
        raise RuleError(errors[rule.name])
    if rule.name not in fails:
        raise RuleError(f"rule {rule.name!r}: {rule.type} is not a row rule")
    return pc.invert(fails[rule.name])


def _sample(table: pa.Table, mask) -> list[dict[str, Any]]:
    return table.filter(mask).slice(0, SAMPLE_ROWS).to_pylist()


def failed_rules_column(fails: dict[str, pa.ChunkedArray], mask=None) -> pa.Array:
    """`_failed_rules` from `tag_failures`' flags: per row (of those `mask` selects), the names of
    the rules it fails, in the rules' order."""
    names = list(fails)
    flags = [(fails[n] if mask is None else fails[n].filter(mask)) for n in names]
    if not names:
        return pa.array([[]] * (0 if mask is None else int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)),
                        pa.list_(pa.string()))
    matrix = np.column_stack([f.to_numpy(zero_copy_only=False) for f in flags]).astype(bool, copy=False)
    row_of, rule_of = np.nonzero(matrix)  # row-major: each row's rules in the rules' order
    offsets = np.zeros(matrix.shape[0] + 1, np.int32)
    np.cumsum(np.bincount(row_of, minlength=matrix.shape[0]), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.array(names, dtype=object)[rule_of], pa.string()))


def tag(table: pa.Table, rules: list[Rule], errors: dict[str, str], time_zone: str = "UTC") -> pa.Table:
    """`table` with `_failed_rules`: the names of every enabled row rule the row fails (a rule that
    cannot be evaluated tags nothing; its error goes to `errors`), as Spark's `rules.tag_failures`."""
    fails = tag_failures(table, rules, errors, time_zone)
    column = failed_rules_column(fails) if fails else pa.array([[]] * table.num_rows, pa.list_(pa.string()))
    return table.append_column(FAILED_RULES_COLUMN, column)


def evaluate(new: pa.Table, rules: list[Rule], context: dict[str, Any]) -> list[CheckOutcome]:
    """Every enabled rule on the rows this run adds (`new`), with the outcomes and messages of
    `lakehouse.validation.rules.evaluate_rules`; `context` as there (`table`: the branch's key
    columns for unique)."""
    enabled = [r for r in rules if r.enabled]
    actions: ActionCounts | None = context.get("row_actions")
    handled = {r.name for r in acting_rules(enabled)} if actions is not None else set()
    total = new.num_rows
    errors: dict[str, str] = {}
    fails = tag_failures(new, [r for r in enabled if r.name not in handled], errors, context.get("time_zone", "UTC"))
    outcomes: dict[str, CheckOutcome] = {}
    for r in enabled:
        if r.name in handled:
            outcomes[r.name] = action_outcome(r, actions)
            continue
        try:
            if r.name in errors:
                raise RuleError(errors[r.name])
            if r.is_row_rule:
                fail = fails[r.name]
                failed = pc.sum(fail.cast(pa.int64())).as_py() or 0
                outcomes[r.name] = row_outcome(r, failed, total, _sample(new, fail) if failed else [], "arrow")
            elif r.type == "unique":
                outcomes[r.name] = _unique(r, context["table"], int(context.get("row_count_after") or total))
            elif r.type == "freshness":
                outcomes[r.name] = _freshness(r, new, context)
            else:
                outcomes[r.name] = dataset_rule(None, r, total, {**context, "_total_from": "arrow"}, {})
        except RuleError as exc:  # as evaluate_rules: a row rule's error counts no rows
            outcomes[r.name] = CheckOutcome(r, False, 0, 0 if r.is_row_rule else total, describe(r),
                                            message=str(exc), details={"error": str(exc)})
    return label_scopes([outcomes[r.name] for r in enabled], context, handled)


def _unique(r: Rule, table: pa.Table, rows: int) -> CheckOutcome:
    """SQL UNIQUE semantics over the whole branch: NULL keys are not duplicates."""
    cols = [_column(table, r, c) for c in r.columns]
    if len(cols) == 1:
        # the common case answered by a hash of the values (~5 ms per 100k keys); grouping, which
        # also counts each duplicate for the sample, costs ~10x that on its first call in a process
        valid = cols[0].drop_null()
        if len(pc.unique(valid)) == len(valid):
            return unique_outcome(r, 0, 0, rows, [])
    keys = pa.table(cols, names=[f"k{i}" for i in range(len(cols))])
    present = None
    for c in cols:
        present = pc.is_valid(c) if present is None else pc.and_(present, pc.is_valid(c))
    grouped = keys.filter(present).group_by(keys.column_names).aggregate([([], "count_all")])
    dup = grouped.filter(pc.greater(grouped.column("count_all"), 1))
    dups, nkeys = int(pc.sum(dup.column("count_all")).as_py() or 0), dup.num_rows
    sample = [{**{c: row[f"k{i}"] for i, c in enumerate(r.columns)}, "rows": row["count_all"]}
              for row in dup.slice(0, SAMPLE_ROWS).to_pylist()] if dups else []
    return unique_outcome(r, dups, nkeys, rows, sample)



def _freshness(r: Rule, table: pa.Table, context: dict[str, Any]) -> CheckOutcome:
    """The newest instant of the rule's column and, when it is too old, the stale rows: the shared
    `predicates.instant` / `stale_predicate` in DuckDB, the shared `freshness_outcome`."""
    import datetime as dt

    import duckdb

    from lakehouse.sql.parse import DuckdbSqlError, condition_to_duckdb

    tz = context.get("time_zone", "UTC")
    rows = _Rows(table, tz)
    predicates.require_columns(table.column_names, r, [r.column])
    now = context.get("now") or dt.datetime.now(dt.UTC).replace(tzinfo=None)
    try:
        newest_of = exp.Max(this=condition_to_duckdb(predicates.instant(r.column)))
        stale_tree = condition_to_duckdb(predicates.stale_predicate(r, table.column_names, freshness_cutoff(r, now)))
        newest = _query(rows.relation([newest_of]), [newest_of], tz).column(0)[0].as_py()
        newest = None if newest is None else newest.astimezone(dt.UTC).replace(tzinfo=None)
        stale, sample = 0, []
        if not is_fresh(r, newest, now) and table.num_rows:
            mask = pc.fill_null(_query(rows.relation([stale_tree]), [stale_tree], tz).column(0), True)
            stale = pc.sum(mask.cast(pa.int64())).as_py() or 0
            sample = _sample(table, mask)
    except (DuckdbSqlError, duckdb.Error) as exc:
        raise _not_valid(r, exc) from exc
    return freshness_outcome(r, newest, now, stale, table.num_rows, sample, "arrow")
