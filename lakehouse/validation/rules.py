"""Rule evaluation on Spark DataFrames.

Row rules compile to a Spark SQL boolean "this row passes"; dataset rules compute one
aggregate. Everything that reaches SQL text is quoted by `lakehouse.iceberg.quote` /
`sql_string`, except `expression` rules, which are Spark SQL written by the metadata author
and parsed by sqlglot first so that only a single boolean expression is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.iceberg import quote, sql_string
from lakehouse.metadata.model import Rule

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SAMPLE_ROWS = 5


@dataclass
class CheckOutcome:
    rule: Rule
    passed: bool
    failed_rows: int = 0
    total_rows: int = 0
    expression: str = ""
    sample: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def blocking_failure(self) -> bool:
        return not self.passed and self.rule.severity == "error"


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return sql_string(str(v))


def check_expression(expression: str) -> str:
    """Accept only a single boolean expression (no statements, no subqueries)."""
    import sqlglot
    from sqlglot import exp

    from lakehouse.sqlparse import SqlParseError

    try:
        tree = sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise SqlParseError(f"rule expression {expression!r} does not parse: {exc}") from exc
    if isinstance(tree, (exp.Query, exp.Command, exp.DDL, exp.DML)) or tree.find(exp.Subquery, exp.Select):
        raise SqlParseError(f"rule expression {expression!r} must be a boolean expression, not a statement")
    return expression


def row_predicate(rule: Rule) -> str:
    """Spark SQL boolean that is TRUE when a row passes the rule (NULL counts as failing)."""
    if rule.type == "not_null":
        return " AND ".join(f"{quote(c)} IS NOT NULL" for c in rule.columns)
    col = quote(rule.column) if rule.column else ""
    if rule.type == "accepted_values":
        return f"{col} IN ({', '.join(_literal(v) for v in rule.values)})"
    if rule.type == "range":
        parts = []
        if rule.min is not None:
            parts.append(f"{col} >= {_literal(rule.min)}")
        if rule.max is not None:
            parts.append(f"{col} <= {_literal(rule.max)}")
        return " AND ".join(parts)
    if rule.type == "regex":
        return f"{col} RLIKE {sql_string(rule.pattern or '')}"
    if rule.type == "expression":
        return f"({check_expression(rule.expression or '')})"
    raise ValueError(f"{rule.type} is not a row rule")


def _passes(rule: Rule) -> str:
    return f"coalesce(({row_predicate(rule)}), false)"


def split_row_actions(df: DataFrame, rules: list[Rule]) -> tuple[DataFrame, DataFrame | None]:
    """Apply drop/quarantine row rules: (rows to keep, rows to quarantine with the failed rule names)."""
    from pyspark.sql import functions as F

    acting = [r for r in rules if r.enabled and r.is_row_rule and r.action in ("drop", "quarantine")]
    if not acting:
        return df, None
    flags = [F.when(~F.expr(_passes(r)), F.lit(r.name)) for r in acting]
    tagged = df.withColumn("_failed_rules", F.filter(F.array(*flags), lambda x: x.isNotNull()))
    keep = tagged.where(F.size("_failed_rules") == 0).drop("_failed_rules")
    quarantine_names = [r.name for r in acting if r.action == "quarantine"]
    bad = tagged.where(F.arrays_overlap(F.col("_failed_rules"), F.array(*[F.lit(n) for n in quarantine_names]))) if quarantine_names else None
    return keep, bad


def evaluate_rules(df: DataFrame, rules: list[Rule], *, context: dict[str, Any] | None = None) -> list[CheckOutcome]:
    """Evaluate every enabled rule on `df` (the audit branch). Row rules share one aggregation pass."""
    from pyspark.sql import functions as F

    context = context or {}
    enabled = [r for r in rules if r.enabled]
    row_rules = [r for r in enabled if r.is_row_rule]
    outcomes: list[CheckOutcome] = []
    aggs = [F.count(F.lit(1)).alias("__total")]
    for i, r in enumerate(row_rules):
        aggs.append(F.sum(F.when(F.expr(_passes(r)), 0).otherwise(1)).alias(f"__f{i}"))
    agg = df.agg(*aggs).collect()[0]
    total = int(agg["__total"])
    for i, r in enumerate(row_rules):
        failed = int(agg[f"__f{i}"] or 0)
        sample = []
        if failed:
            sample = [row.asDict() for row in df.where(~F.expr(_passes(r))).limit(SAMPLE_ROWS).collect()]
        # drop/quarantine rules already removed their rows before the write: they pass on the branch
        outcomes.append(CheckOutcome(r, failed == 0, failed, total, row_predicate(r), sample,
                                     f"{failed} of {total} rows fail {r.name}" if failed else "all rows pass"))
    for r in enabled:
        if r.is_row_rule:
            continue
        outcomes.append(_dataset_rule(df, r, total, context))
    return outcomes


def _dataset_rule(df: DataFrame, r: Rule, total: int, context: dict[str, Any]) -> CheckOutcome:
    from pyspark.sql import functions as F

    if r.type == "row_count":
        lo = float(r.min) if r.min is not None else None
        hi = float(r.max) if r.max is not None else None
        ok = (lo is None or total >= lo) and (hi is None or total <= hi)
        return CheckOutcome(r, ok, 0 if ok else total, total, f"row_count between {lo} and {hi}",
                            message=f"{total} rows")
    if r.type == "unique":
        cols = [quote(c) for c in r.columns]
        dup = df.groupBy(*[F.col(c) for c in r.columns]).count().where("count > 1")
        dups = dup.agg(F.coalesce(F.sum("count"), F.lit(0))).collect()[0][0] or 0
        sample = [row.asDict() for row in dup.limit(SAMPLE_ROWS).collect()] if dups else []
        return CheckOutcome(r, dups == 0, int(dups), total, f"unique({', '.join(cols)})", sample,
                            f"{dups} rows share a key" if dups else "keys unique")
    if r.type == "row_count_change":
        prev = context.get("previous_row_count")
        if not prev:
            return CheckOutcome(r, True, 0, total, "row count change", message="no previous snapshot")
        change = abs(total - prev) * 100.0 / prev
        ok = change <= float(r.max_change_pct or 0)
        return CheckOutcome(r, ok, 0, total, f"|rows - {prev}| / {prev} <= {r.max_change_pct}%",
                            message=f"changed {change:.1f}% ({prev} -> {total})", details={"change_pct": change})
    if r.type == "freshness":
        newest = df.agg(F.max(F.col(r.column)).cast("timestamp")).collect()[0][0]
        now = context.get("now")
        import datetime as dt

        now = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
        age = (now - newest).total_seconds() if newest is not None else None
        ok = age is not None and age <= (r.max_age_seconds or 0)
        return CheckOutcome(r, ok, 0, total, f"max({r.column}) within {r.max_age_seconds}s",
                            message=f"newest {newest}, age {age}s", details={"age_seconds": age})
    if r.type == "schema_contract":
        actual = {f.name.lower(): f.dataType.simpleString() for f in df.schema.fields}
        problems = []
        for c in r.expected_columns:
            got = actual.get(c.name.lower())
            if got is None:
                problems.append(f"missing column {c.name}")
            elif got != c.type.lower().replace(" ", ""):
                problems.append(f"column {c.name} is {got}, expected {c.type}")
        expected = {c.name.lower() for c in r.expected_columns}
        extra = [n for n in actual if n not in expected and not n.startswith("_")]
        if extra and r.schema_policy in ("freeze", "fail"):
            problems.append(f"unexpected columns {extra}")
        return CheckOutcome(r, not problems, 0, total, "schema contract", message="; ".join(problems) or "schema matches",
                            details={"problems": problems, "policy": r.schema_policy})
    if r.type == "referential_integrity":
        ref_df = context.get("ref_frames", {}).get(r.ref_dataset)
        if ref_df is None:
            return CheckOutcome(r, False, 0, total, "referential integrity",
                                message=f"reference dataset {r.ref_dataset} not readable")
        cond = [df[c] == ref_df[rc] for c, rc in zip(r.columns, r.ref_columns, strict=True)]
        orphans = df.join(ref_df, cond, "left_anti")
        n = orphans.count()
        return CheckOutcome(r, n == 0, n, total, f"({', '.join(r.columns)}) in {r.ref_dataset}({', '.join(r.ref_columns)})",
                            [row.asDict() for row in orphans.limit(SAMPLE_ROWS).collect()] if n else [],
                            f"{n} orphan rows" if n else "all keys found")
    raise ValueError(f"unknown dataset rule type {r.type}")
