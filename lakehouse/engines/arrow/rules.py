"""Rules evaluated on Arrow tables with pyarrow.compute (expressions in DuckDB), with the outcomes
and messages of lakehouse.validation.rules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

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
    label_scopes,
    row_outcome,
)

if TYPE_CHECKING:
    from lakehouse.metadata.model import Rule


def _column(table: pa.Table, rule: Rule, name: str) -> pa.ChunkedArray:
    by_name = {n.lower(): n for n in table.column_names}
    if name.lower() not in by_name:
        raise RuleError(f"rule {rule.name!r}: column(s) {[name]} not in the dataset (columns: "
                        f"{sorted(table.column_names)})")
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


def _literal(value: Any, like: pa.DataType) -> pa.Scalar:
    try:
        return pa.scalar(value).cast(like)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return pa.scalar(str(value)).cast(like)


def passes(rule: Rule, table: pa.Table, time_zone: str = "UTC") -> pa.ChunkedArray:
    """TRUE where a row passes a row rule (NULL counts as failing), as `rules.row_condition`."""
    if rule.type == "expression":
        return _expression_passes(rule, table, time_zone)
    if rule.type == "not_null":
        cond = None
        for c in rule.columns:
            ok = pc.is_valid(_column(table, rule, c))
            cond = ok if cond is None else pc.and_(cond, ok)
        return cond
    if not rule.column:
        raise RuleError(f"rule {rule.name!r} of type {rule.type} needs column")
    col = _column(table, rule, rule.column)
    if rule.type == "accepted_values":
        cond = pc.is_in(col, value_set=pa.array([_literal(v, col.type).as_py() for v in rule.values], col.type))
        cond = pc.if_else(pc.is_null(col), None, cond)
    elif rule.type == "range":
        cond = pc.is_valid(col)
        if rule.min is not None:
            at_least = pc.greater_equal(col, _literal(rule.min, col.type))
            if pa.types.is_floating(col.type):  # Spark orders NaN above every number: NaN >= min
                at_least = pc.or_kleene(at_least, pc.is_nan(col))
            cond = pc.and_kleene(cond, at_least)
        if rule.max is not None:
            cond = pc.and_kleene(cond, pc.less_equal(col, _literal(rule.max, col.type)))
    elif rule.type == "regex":
        cond = pc.match_substring_regex(_spark_string(rule, col, time_zone), rule.pattern or "")
    else:
        raise RuleError(f"rule {rule.name!r}: {rule.type} is not a row rule the Arrow engine evaluates")
    return pc.fill_null(cond, False)


def _expression_passes(rule: Rule, table: pa.Table, time_zone: str) -> pa.ChunkedArray:
    """An `expression` rule (Spark SQL) evaluated in DuckDB over the rows: sqlglot carries Spark's
    semantics over (a CAST that fails is NULL, x / 0 is NULL), what it cannot carry is refused
    when the metadata is validated (lakehouse.metadata.engine_support). The same checks as Spark's:
    one boolean row-level expression of the table's columns, the same answer on every evaluation."""
    import duckdb

    from lakehouse.sources.duckdb_sql import connect
    from lakehouse.sql.parse import DuckdbSqlError, expression_to_duckdb
    from lakehouse.validation.rules import check_expression

    text = check_expression(rule.expression or "", rule.name)
    try:
        sql = expression_to_duckdb(text)
    except DuckdbSqlError as exc:
        raise RuleError(f"rule {rule.name!r}: expression {text!r} cannot be evaluated without Spark: {exc}") from exc
    con = connect(time_zone)  # one answer per row, in the rows' order; no file or network access
    try:
        con.register("__lh_rows", table)
        result = con.execute(f"SELECT ({sql}) AS ok FROM __lh_rows").fetch_arrow_table().column(0)
    except duckdb.Error as exc:
        raise RuleError(f"rule {rule.name!r}: expression {text!r} is not valid here: "
                        f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from exc
    finally:
        con.close()
    if not pa.types.is_boolean(result.type):
        raise RuleError(f"rule {rule.name!r}: expression {text!r} is {result.type}, not boolean")
    return pc.fill_null(result, False)


def _sample(table: pa.Table, mask) -> list[dict[str, Any]]:
    return table.filter(mask).slice(0, SAMPLE_ROWS).to_pylist()


def tag_failures(table: pa.Table, rules: list[Rule], errors: dict[str, str], time_zone: str = "UTC"
                 ) -> dict[str, pa.ChunkedArray]:
    """rule name -> TRUE where the row fails it, for every enabled row rule that can be evaluated
    (the others' errors go to `errors`), as `rules.tag_failures`."""
    out = {}
    for r in (r for r in rules if r.enabled and r.is_row_rule):
        try:
            out[r.name] = pc.invert(passes(r, table, time_zone))
        except RuleError as exc:
            errors[r.name] = str(exc)
    return out


def failed_rules_column(fails: dict[str, pa.ChunkedArray], mask=None) -> pa.Array:
    """`_failed_rules` from `tag_failures`' flags: per row (of those `mask` selects), the names of
    the rules it fails, in the rules' order."""
    names = list(fails)
    flags = [(fails[n] if mask is None else fails[n].filter(mask)).to_pylist() for n in names]
    return pa.array([[n for n, f in zip(names, row, strict=True) if f] for row in zip(*flags, strict=True)],
                    pa.list_(pa.string()))


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
    outcomes: dict[str, CheckOutcome] = {}
    for r in enabled:
        if r.name in handled:
            outcomes[r.name] = action_outcome(r, actions)
            continue
        try:
            if r.is_row_rule:
                fail = pc.invert(passes(r, new, context.get("time_zone", "UTC")))
                failed = pc.sum(fail.cast(pa.int64())).as_py() or 0
                outcomes[r.name] = row_outcome(r, failed, total, _sample(new, fail) if failed else [], "arrow")
            elif r.type == "unique":
                outcomes[r.name] = _unique(r, context["table"], int(context.get("row_count_after") or total))
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
            return CheckOutcome(r, True, 0, rows, describe(r), [], "all keys unique", details={"duplicate_keys": 0})
    keys = pa.table(cols, names=[f"k{i}" for i in range(len(cols))])
    present = None
    for c in cols:
        present = pc.is_valid(c) if present is None else pc.and_(present, pc.is_valid(c))
    grouped = keys.filter(present).group_by(keys.column_names).aggregate([([], "count_all")])
    dup = grouped.filter(pc.greater(grouped.column("count_all"), 1))
    dups, nkeys = int(pc.sum(dup.column("count_all")).as_py() or 0), dup.num_rows
    sample = [{**{c: row[f"k{i}"] for i, c in enumerate(r.columns)}, "rows": row["count_all"]}
              for row in dup.slice(0, SAMPLE_ROWS).to_pylist()] if dups else []
    return CheckOutcome(r, dups == 0, dups, rows, describe(r), sample,
                        f"{dups} rows share {nkeys} duplicated key(s)" if dups else "all keys unique",
                        details={"duplicate_keys": nkeys})

