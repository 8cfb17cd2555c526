"""Rule evaluation on Spark DataFrames, and the outcomes and messages both engines share.

Row rules are the engine-neutral predicates of lakehouse.validation.predicates (one sqlglot tree
per rule kind, identifiers quoted and values typed, never pasted) rendered as Spark SQL; the counts
come from the new files' Iceberg statistics where they decide them, else from one list of
aggregates shared by all row rules (`RowPass`). `expression` rules are Spark SQL written by the
metadata author: sqlglot must parse them as ONE boolean scalar expression (no statement,
subquery, aggregate or window) and Spark must type them as boolean before they run. The
schema contract is checked with pandera's pyspark backend (schema-only, no data scan).
`row_outcome`, `action_outcome`, `unique_outcome`, `dataset_rule` (row_count, row_count_change)
and `label_scopes` are the outcome and message code of both engines (lakehouse.engines.arrow.rules).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.metadata.model import Rule
from lakehouse.table.iceberg import quote, sql_string
from lakehouse.validation import predicates
from lakehouse.validation.predicates import RuleError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)

SAMPLE_ROWS = 5
FAILED_RULES_COLUMN = "_failed_rules"
ROW_ACTIONS = ("drop", "quarantine")


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
    #: what total_rows / failed_rows counted (`label_scopes`): the input rows (a merge: its change
    #: set), the rows this run appended, the branch's rows of the merged keys, or the table
    scope: str = ""

    @property
    def blocking_failure(self) -> bool:
        """Only `error` severity blocks publish (and downstream assets); `warn` is reported."""
        return not self.passed and self.rule.severity == "error"


# --------------------------------------------------------------------------- row rules
def check_expression(expression: str, rule_name: str = "?") -> str:
    """`expression` when it is a single scalar boolean-looking expression (no statement, subquery,
    aggregate, window or second statement smuggled in after a `;`), else RuleError."""
    predicates.check_expression(expression, rule_name)
    return expression


def _col(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(quote(name))


def _require_columns(df_columns: list[str], rule: Rule, names: list[str]) -> None:
    predicates.require_columns(df_columns, rule, names)


def row_condition(rule: Rule, df: DataFrame) -> Column:
    """TRUE when a row passes `rule` (a NULL result counts as failing): the rule's one predicate
    (lakehouse.validation.predicates) as Spark SQL. An `expression` rule runs as its author wrote
    it, and must be boolean and deterministic on Spark's own plan."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    if rule.type != "expression":
        return F.expr(predicates.row_predicate(rule, df.columns).sql(dialect="spark"))
    text = check_expression(rule.expression or "", rule.name)
    try:
        cond = F.expr(text)
        probe = df.select(cond.alias("__c"))
        dtype = probe.schema[0].dataType
    except Exception as exc:  # noqa: BLE001 - AnalysisException / ParseException: name the rule
        raise RuleError(f"rule {rule.name!r}: expression {text!r} is not valid here: "
                        f"{str(exc).splitlines()[0]}") from exc
    if not isinstance(dtype, BooleanType):
        raise RuleError(f"rule {rule.name!r}: expression {text!r} is {dtype.simpleString()}, not boolean")
    if not _deterministic(probe):
        raise RuleError(f"rule {rule.name!r}: expression {text!r} is not deterministic (rand(), uuid(), ... "
                        "answer differently on every evaluation), so its failing rows cannot be counted")
    return F.coalesce(cond, F.lit(False))


def _deterministic(frame: DataFrame) -> bool:
    """Whether the frame's one analysed expression is deterministic (Spark refuses to observe or
    re-plan a non-deterministic one); True when the plan cannot be inspected."""
    try:
        return pyspark_compat.analyzed_deterministic(frame)
    except Exception:  # noqa: BLE001 - not a JVM-backed frame: nothing to inspect
        return True


def describe(rule: Rule) -> str:
    """The rule as Spark SQL text for people (check metadata, history); never executed."""
    col = quote(rule.column) if rule.column else ""
    cols = ", ".join(quote(c) for c in rule.columns)
    if rule.type == "not_null":
        return " AND ".join(f"{quote(c)} IS NOT NULL" for c in rule.columns)
    if rule.type == "accepted_values":
        return f"{col} IN ({', '.join(_literal(v) for v in rule.values)})"
    if rule.type == "range":
        parts = ([f"{col} >= {_literal(rule.min)}"] if rule.min is not None else []) + \
                ([f"{col} <= {_literal(rule.max)}"] if rule.max is not None else [])
        return " AND ".join(parts)
    if rule.type == "regex":
        return f"{col} RLIKE {sql_string(rule.pattern or '')}"
    if rule.type == "expression":
        return rule.expression or ""
    if rule.type == "row_count":
        return " AND ".join(p for p in [f"count(*) >= {_literal(rule.min)}" if rule.min is not None else "",
                                        f"count(*) <= {_literal(rule.max)}" if rule.max is not None else ""] if p) \
            or "count(*) >= 0"
    if rule.type == "row_count_change":
        return f"abs(rows - previous_rows) * 100 / previous_rows <= {rule.max_change_pct}"
    if rule.type == "freshness":
        return f"current_timestamp() - max({col}) <= INTERVAL {int(rule.max_age_seconds or 0)} SECONDS"
    if rule.type == "unique":
        return f"count(*) = 1 GROUP BY {cols}"
    if rule.type == "referential_integrity":
        return f"({cols}) IN (SELECT {', '.join(quote(c) for c in rule.ref_columns)} FROM {rule.ref_dataset})"
    if rule.type == "schema_contract":
        return f"schema ({', '.join(f'{quote(c.name)} {c.type}' for c in rule.expected_columns)}), " \
               f"policy {rule.schema_policy}"
    return rule.type


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return sql_string(str(v))


def _sample(df: DataFrame, n: int = SAMPLE_ROWS) -> list[dict[str, Any]]:
    return [r.asDict(recursive=True) for r in df.limit(n).collect()]


# --------------------------------------------------------------------------- row actions
@dataclass
class RowSplit:
    """A batch split by its drop/quarantine rules."""

    keep: DataFrame
    quarantine: DataFrame | None  # input columns + _failed_rules (every row rule the row failed)
    tagged: DataFrame | None  # input + _failed_rules, for counting


def acting_rules(rules: list[Rule]) -> list[Rule]:
    return [r for r in rules if r.enabled and r.is_row_rule and r.action in ROW_ACTIONS]


def tag_failures(df: DataFrame, rules: list[Rule], errors: dict[str, str] | None = None) -> DataFrame:
    """Adds `_failed_rules`: the names of every enabled row rule the row fails. A rule that cannot
    be evaluated (unknown column, bad expression) tags nothing; its error goes to `errors`."""
    from pyspark.sql import functions as F

    flags = []
    for r in (r for r in rules if r.enabled and r.is_row_rule):
        try:
            flags.append(F.when(~row_condition(r, df), F.lit(r.name)))
        except RuleError as exc:
            if errors is None:
                raise
            errors[r.name] = str(exc)
    names = F.array(*flags) if flags else F.array().cast("array<string>")
    return df.withColumn(FAILED_RULES_COLUMN, F.filter(names, lambda x: x.isNotNull()))


def split_rows(df: DataFrame, rules: list[Rule], errors: dict[str, str] | None = None) -> RowSplit:
    """Rows failing a drop rule are removed; rows failing a quarantine rule are set aside (a row
    failing both is quarantined: never lose a row someone may want back)."""
    from pyspark.sql import functions as F

    errors = {} if errors is None else errors
    acting = acting_rules(rules)
    if not acting:
        return RowSplit(df, None, None)
    tagged = tag_failures(df, rules, errors)
    acting = [r for r in acting if r.name not in errors]
    if not acting:
        return RowSplit(df, None, None)
    failed = F.col(FAILED_RULES_COLUMN)
    acting_names = F.array(*[F.lit(r.name) for r in acting])
    keep = tagged.where(~F.arrays_overlap(failed, acting_names)).drop(FAILED_RULES_COLUMN)
    q_names = [r.name for r in acting if r.action == "quarantine"]
    bad = tagged.where(F.arrays_overlap(failed, F.array(*[F.lit(n) for n in q_names]))) if q_names else None
    return RowSplit(keep, bad, tagged)


def split_row_actions(df: DataFrame, rules: list[Rule]) -> tuple[DataFrame, DataFrame | None]:
    """(rows to keep, rows to quarantine with `_failed_rules`); kept for existing callers."""
    s = split_rows(df, rules)
    return s.keep, s.quarantine


@dataclass
class ActionCounts:
    """Per-rule failure counts of drop/quarantine rules, accumulated over a run's batches."""

    total: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # rules that could not be evaluated

    def _acting(self, rules: list[Rule]) -> list[Rule]:
        return [r for r in acting_rules(rules) if r.name not in self.errors]

    def aggregates(self, rules: list[Rule]) -> list[Column]:
        """Failing rows per acting rule (`__a<i>`), over frames carrying `_failed_rules`."""
        from pyspark.sql import functions as F

        failed = F.col(FAILED_RULES_COLUMN)
        return [F.sum(F.when(F.array_contains(failed, r.name), 1).otherwise(0)).alias(f"__a{i}")
                for i, r in enumerate(self._acting(rules))]

    def add(self, tagged: DataFrame, rules: list[Rule]) -> None:
        """Count a batch by one aggregate over its tagged rows."""
        from pyspark.sql import functions as F

        row = tagged.agg(F.count(F.lit(1)).alias("__total"), *self.aggregates(rules)).collect()[0].asDict()
        self.record(int(row["__total"]), row, tagged, rules)

    def record(self, total: int, counts: dict[str, Any], tagged: DataFrame, rules: list[Rule]) -> None:
        """Add a batch's counts (`__a<i>` as `aggregates` names them; a missing one is 0) and
        sample the rows of the rules that failed from `tagged`."""
        from pyspark.sql import functions as F

        self.total += total
        failed = F.col(FAILED_RULES_COLUMN)
        for i, r in enumerate(self._acting(rules)):
            n = int(counts.get(f"__a{i}") or 0)
            self.failed[r.name] = self.failed.get(r.name, 0) + n
            if n and len(self.samples.get(r.name, [])) < SAMPLE_ROWS:
                self.samples.setdefault(r.name, []).extend(
                    _sample(tagged.where(F.array_contains(failed, r.name)).drop(FAILED_RULES_COLUMN)))


# --------------------------------------------------------------------------- schema contract
@dataclass
class SchemaDrift:
    missing: list[str] = field(default_factory=list)
    retyped: list[dict[str, str]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # evolve: added to the table
    ignored: list[str] = field(default_factory=list)  # freeze/fail: not written
    quarantined: list[dict] = field(default_factory=list)  # files that did not fit, {key, reason}

    def merge(self, other: SchemaDrift) -> None:
        for f in ("missing", "retyped", "extra", "added", "ignored", "quarantined"):
            cur = getattr(self, f)
            cur.extend(x for x in getattr(other, f) if x not in cur)


def _user_columns(df: DataFrame) -> list[str]:
    """Columns the platform adds (`_source_file`, `_ingested_at`, ...) are outside every contract."""
    return [c for c in df.columns if not c.startswith("_")]


def schema_drift(df: DataFrame, rule: Rule) -> SchemaDrift:
    """Compare the input's schema with the contract using pandera (schema-only: no Spark job)."""
    import pandera.pyspark as pa
    from pandera.config import ValidationDepth, config_context

    cols = {}
    for c in rule.expected_columns:
        try:
            dtype = pyspark_compat.parse_type(c.type)
        except Exception as exc:  # noqa: BLE001
            raise RuleError(f"rule {rule.name!r}: column {c.name!r} has an unknown Spark type {c.type!r}") from exc
        # nullable is counted in the data pass, not by pandera (its null check is one Spark job per column)
        cols[c.name] = pa.Column(dtype, nullable=True, name=c.name)
    user = _user_columns(df)
    schema = pa.DataFrameSchema(cols, strict=False, name=rule.name)
    with config_context(validation_depth=ValidationDepth.SCHEMA_ONLY):
        checked = schema.validate(df.select(*[_col(c) for c in user]), lazy=True)
    errors = dict(checked.pandera.errors or {}).get("SCHEMA", {})
    drift = SchemaDrift()
    for e in errors.get("COLUMN_NOT_IN_DATAFRAME", []):
        drift.missing.append(e["column"])
    actual = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    expected = {c.name: c.type for c in rule.expected_columns}
    for e in errors.get("WRONG_DATATYPE", []):
        drift.retyped.append({"column": e["column"], "expected": expected.get(e["column"], "?"),
                              "actual": actual.get(e["column"], "?")})
    names = {c.name.lower() for c in rule.expected_columns}
    drift.extra = [c for c in user if c.lower() not in names]
    return drift


def contract_outcome(rule: Rule, drift: SchemaDrift, total: int, null_counts: dict[str, int] | None = None
                     ) -> CheckOutcome:
    problems = [f"missing column {c}" for c in drift.missing]
    problems += [f"column {r['column']} is {r['actual']}, expected {r['expected']}" for r in drift.retyped]
    if rule.schema_policy == "fail" and drift.extra:
        problems.append(f"unexpected new column(s) {drift.extra}")
    nulls = {c: n for c, n in (null_counts or {}).items() if n}
    problems += [f"{n} NULL(s) in non-nullable column {c}" for c, n in nulls.items()]
    notes = []
    if drift.added:
        notes.append(f"added column(s) {drift.added} to the table (policy evolve)")
    if drift.ignored and rule.schema_policy == "freeze":
        notes.append(f"ignored new column(s) {drift.ignored} (policy freeze)")
    if drift.quarantined:
        notes.append(f"quarantined {len(drift.quarantined)} file(s) that do not fit the table: "
                     + "; ".join(f"{q['key']}: {q['reason']}" for q in drift.quarantined[:5]))
    msg = "; ".join(problems + notes) or "schema matches the contract"
    return CheckOutcome(rule, not problems, sum(nulls.values()), total, describe(rule), message=msg,
                        details={"policy": rule.schema_policy, "missing": drift.missing, "retyped": drift.retyped,
                                 "new_columns": drift.extra, "added": drift.added, "ignored": drift.ignored,
                                 "quarantined_files": drift.quarantined,
                                 "null_counts": nulls})


# --------------------------------------------------------------------------- evaluation
@dataclass
class RowPass:
    """All row-level counting of a rule set as keyed aggregates: `total`, failing rows per row
    rule (`f:<rule>`), NULLs in non-nullable contract columns (`n:<column>`), newest value per
    freshness column (`m:<column>`, epoch seconds). A key is answered from the new files' Iceberg
    statistics when they decide it (`FileMetrics.answer`), else from aggregates observed on the
    rows while they were written to the branch (`DataFrame.observe`), else by one `df.agg`."""

    conds: dict[str, Column]
    rules: dict[str, Rule]
    errors: dict[str, str]
    not_nullable: list[str]
    fresh_cols: list[str]
    key_errors: dict[str, str] = field(default_factory=dict)  # keys whose aggregate failed on the data
    unique_counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # rule -> (rows, keys) duplicated

    @classmethod
    def plan(cls, df: DataFrame, rules: list[Rule], exclude: set[str] = frozenset()) -> RowPass:
        conds, planned, errors = {}, {}, {}
        for r in rules:
            if r.enabled and r.is_row_rule and r.name not in exclude:
                try:
                    conds[r.name] = row_condition(r, df)
                    planned[r.name] = r
                except RuleError as exc:
                    errors[r.name] = str(exc)
        have = {c.lower() for c in df.columns}
        not_nullable = sorted({c.name for r in rules if r.enabled and r.type == "schema_contract"
                               for c in r.expected_columns if not c.nullable and c.name.lower() in have})
        fresh = sorted({r.column for r in rules if r.enabled and r.type == "freshness" and r.column
                        and r.column.lower() in have})
        return cls(conds, planned, errors, not_nullable, fresh)

    def keys(self) -> set[str]:
        return {"total", *(f"f:{n}" for n in self.conds), *(f"n:{c}" for c in self.not_nullable),
                *(f"m:{c}" for c in self.fresh_cols)}

    def _aggregates(self) -> dict[str, Column]:
        from pyspark.sql import functions as F

        aggs = {"total": F.count(F.lit(1))}
        aggs |= {f"f:{n}": F.sum(F.when(c, 0).otherwise(1)) for n, c in self.conds.items()}
        aggs |= {f"n:{c}": F.sum(F.when(_col(c).isNull(), 1).otherwise(0)) for c in self.not_nullable}
        # epoch seconds, not a timestamp: observed metrics come back through py4j, plain numbers only
        aggs |= {f"m:{c}": F.max(_col(c).cast("timestamp").cast("double")) for c in self.fresh_cols}
        return aggs

    def aggregates(self, keys: set[str] | None = None) -> list[Column]:
        """The aggregates computing `keys` (all keys by default), each aliased to its key."""
        return [a.alias(k) for k, a in self._aggregates().items() if keys is None or k in keys]

    @staticmethod
    def merge(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
        """Combine the metrics of two batches (counts add up, maxima take the max)."""
        if a is None:
            return dict(b)
        out = dict(a)
        for k, v in b.items():
            cur = out.get(k)
            if k.startswith("m:"):
                out[k] = v if cur is None else (cur if v is None else max(cur, v))
            else:
                out[k] = (cur or 0) + (v or 0)
        return out

    def resolve(self, df: DataFrame, sources: dict[str, dict[str, Any] | None], unique: Rule | None = None
                ) -> tuple[dict[str, Any], dict[str, str]]:
        """Every key's value, from the first of the named `sources` holding it, the rest by one
        pass over `df`; and, per key, the name of where its value came from. With a `unique` rule
        over `df` itself, that pass also counts its duplicates (`unique_counts`): one group-by on
        the rule's key instead of a pass for the keys and another for the rule."""
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for label, src in sources.items():
            for k in self.keys() - values.keys():
                if src and k in src:
                    values[k], origin[k] = src[k], label
        missing = self.keys() - values.keys()
        if unique is not None:
            try:
                got, self.unique_counts[unique.name] = self._grouped(df, missing, unique.columns)
                values.update(got)
                origin.update(dict.fromkeys(missing, "rows"))
                return values, origin
            except Exception:  # noqa: BLE001 - counted apart below, where a failing rule fails only its own check
                log.debug("one pass for the row keys and rule %r failed; counting them apart", unique.name,
                          exc_info=True)
        if missing:
            try:
                values.update(df.agg(*self.aggregates(missing)).collect()[0].asDict())
                origin.update(dict.fromkeys(missing, "rows"))
            except Exception:  # noqa: BLE001 - a rule failing at run time must fail only its own check
                self._resolve_apart(df, missing, values, origin)
        return values, origin

    def _grouped(self, df: DataFrame, keys: set[str], columns: list[str]) -> tuple[dict[str, Any], tuple[int, int]]:
        """`keys` and a unique rule's (duplicated rows, duplicated keys) in one aggregation: the rows
        grouped by the rule's key with each key's partial aggregate, then one global aggregate over
        the groups (counts add up, maxima take the max). A key with a NULL part is no duplicate."""
        from pyspark.sql import functions as F

        names = sorted(keys)
        aggs = self._aggregates()
        per_key = df.groupBy(*[_col(c).alias(f"__g{i}") for i, c in enumerate(columns)]).agg(
            F.count(F.lit(1)).alias("__rows"), *[aggs[k].alias(f"__k{i}") for i, k in enumerate(names)])
        dup = functools.reduce(operator.and_, [F.col(f"__g{i}").isNotNull() for i in range(len(columns))],
                               F.col("__rows") > 1)
        outer = [(F.max if k.startswith("m:") else F.sum)(f"__k{i}") for i, k in enumerate(names)]
        row = per_key.agg(*[F.coalesce(a, F.lit(0)) if k == "total" else a  # count(*) of no rows is 0
                            for a, k in zip(outer, names, strict=True)],
                          F.coalesce(F.sum(F.when(dup, F.col("__rows"))), F.lit(0)),
                          F.count(F.when(dup, F.lit(1)))).collect()[0]
        return {k: row[i] for i, k in enumerate(names)}, (int(row[len(names)]), int(row[len(names) + 1]))

    def _resolve_apart(self, df: DataFrame, keys: set[str], values: dict[str, Any], origin: dict[str, str]) -> None:
        """Count each key on its own; a rule whose count fails (`raise_error`, a cast error under
        ANSI mode) is recorded in `key_errors` and ends its check in error. Any other key failing
        is not a rule's fault and is raised."""
        for k in sorted(keys):
            try:
                values.update(df.agg(*self.aggregates({k})).collect()[0].asDict())
                origin[k] = "rows"
            except Exception as exc:  # noqa: BLE001
                if not k.startswith("f:"):
                    raise
                self.key_errors[k] = (f"rule {k[2:]!r} could not be evaluated on the data: "
                                      f"{(str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]}")


def _from_epoch(seconds: float | None) -> dt.datetime | None:
    """Epoch seconds -> naive UTC datetime (what Spark returns for timestamps in a UTC session)."""
    return None if seconds is None else dt.datetime.fromtimestamp(float(seconds), dt.UTC).replace(tzinfo=None)


def evaluate_rules(df: DataFrame, rules: list[Rule], *, context: dict[str, Any] | None = None) -> list[CheckOutcome]:
    """Evaluate every enabled rule. `df` holds the rows this run adds (on the audit branch).

    context (all optional): `table` (the whole branch: unique; with `unique_scoped`, only the keys of
    `df` are checked against it), `previous_row_count` and
    `row_count_after` (main before, branch after: row_count_change), `ref_frames`
    (ref_dataset -> frame), `row_actions` (ActionCounts of the drop/quarantine split),
    `schema_drift` (rule name -> SchemaDrift seen on the input), `file_metrics` (FileMetrics of
    the files holding `df`), `observed` (RowPass keys observed while the rows were written),
    `now` (naive UTC).
    A rule that cannot be evaluated (unknown column, bad expression) fails with the reason.
    """
    context = context or {}
    enabled = [r for r in rules if r.enabled]
    actions: ActionCounts | None = context.get("row_actions")
    handled = {r.name for r in acting_rules(enabled)} if actions is not None else set()
    rp = RowPass.plan(df, enabled, handled)
    outcomes: dict[str, CheckOutcome] = {}
    for name, err in rp.errors.items():
        r = next(x for x in enabled if x.name == name)
        outcomes[name] = CheckOutcome(r, False, 0, 0, describe(r), message=err, details={"error": err})
    metrics = context.get("file_metrics")
    agg, origin = rp.resolve(df, {"iceberg_file_statistics": metrics.answer(rp) if metrics is not None else None,
                                  "observed_on_write": context.get("observed")}, _shared_unique(df, enabled, context))
    total = int(agg["total"] or 0)
    nulls = {c: int(agg[f"n:{c}"] or 0) for c in rp.not_nullable}
    context = {**context, "_newest": {c: _from_epoch(agg[f"m:{c}"]) for c in rp.fresh_cols},
               "_newest_from": {c: origin[f"m:{c}"] for c in rp.fresh_cols}, "_total_from": origin["total"],
               "_unique_counts": rp.unique_counts}
    for name, cond in rp.conds.items():
        r = next(x for x in enabled if x.name == name)
        if f"f:{name}" in rp.key_errors:
            err = rp.key_errors[f"f:{name}"]
            outcomes[name] = CheckOutcome(r, False, 0, total, describe(r), message=err, details={"error": err})
            continue
        failed = int(agg[f"f:{name}"] or 0)
        outcomes[name] = row_outcome(r, failed, total, _sample(df.where(~cond)) if failed else [],
                                     origin[f"f:{name}"])
    for r in enabled:
        if r.name in handled:
            outcomes[r.name] = action_outcome(r, actions)
        elif not r.is_row_rule:
            try:
                outcomes[r.name] = dataset_rule(df, r, total, context, nulls)
            except RuleError as exc:
                outcomes[r.name] = CheckOutcome(r, False, 0, total, describe(r), message=str(exc),
                                                details={"error": str(exc)})
    return label_scopes([outcomes[r.name] for r in enabled], context, handled)


#: what a check counted (CheckOutcome.scope); the write session says which apply (context `scope`,
#: `input_scope`)
SCOPE_INPUT, SCOPE_CHANGE_SET = "input rows", "change set"
SCOPE_APPENDED, SCOPE_MERGED_KEYS = "rows appended by this run", "branch rows of the merged keys"
SCOPE_PARTITIONS, SCOPE_REPLACED, SCOPE_TABLE = ("branch rows of the replaced partitions",
                                                 "branch rows this run's writes replaced", "table")


def label_scopes(outcomes: list[CheckOutcome], context: dict[str, Any], handled: set[str]) -> list[CheckOutcome]:
    """Say what each outcome counted (its `scope`; the check history keeps it in `details.scope`): a
    drop/quarantine rule the
    input rows it split (a merge: the change set); row_count_change the table before and after;
    `unique` the table (only the written keys of it when the write was scoped); every other rule
    the rows the audit read (context `scope`, default the table)."""
    rows = context.get("scope") or SCOPE_TABLE
    for o in outcomes:
        if o.rule.name in handled:
            o.scope = context.get("input_scope") or SCOPE_INPUT
        elif o.rule.type == "row_count_change":
            o.scope = SCOPE_TABLE
        elif o.rule.type == "unique":
            o.scope = (f"table (the keys of the {rows})" if context.get("unique_scoped") and rows != SCOPE_TABLE
                       else SCOPE_TABLE)
        else:
            o.scope = rows
    return outcomes


def _shared_unique(df: DataFrame, rules: list[Rule], context: dict[str, Any]) -> Rule | None:
    """The first `unique` rule whose rows are `df` itself (the audit's table is the same frame as its
    new rows: a write that replaced the whole branch), so that its group-by can count the row keys
    too; None when there is none or its columns are not all there (its own check says so)."""
    if context.get("table", df) is not df:
        return None
    have = {c.lower() for c in df.columns}
    return next((r for r in rules if r.type == "unique" and r.columns
                 and all(c.lower() in have for c in r.columns)), None)


def row_outcome(r: Rule, failed: int, total: int, sample: list[dict[str, Any]], counted_from: str) -> CheckOutcome:
    """A row rule's outcome from its failing-row count (whichever engine counted)."""
    return CheckOutcome(r, failed == 0, failed, total, describe(r), sample,
                        f"{failed} of {total} rows fail {r.name}" if failed else f"all {total} rows pass",
                        details={"counted_from": counted_from})


def unique_outcome(r: Rule, dups: int, keys: int, rows: int, sample: list[dict[str, Any]]) -> CheckOutcome:
    """A `unique` rule's outcome from its duplicated rows and keys (whichever engine counted)."""
    return CheckOutcome(r, dups == 0, dups, rows, describe(r), sample,
                        f"{dups} rows share {keys} duplicated key(s)" if dups else "all keys unique",
                        details={"duplicate_keys": keys})


def freshness_cutoff(r: Rule, now: dt.datetime) -> dt.datetime:
    return now - dt.timedelta(seconds=r.max_age_seconds or 0)


def is_fresh(r: Rule, newest: dt.datetime | None, now: dt.datetime) -> bool:
    return newest is not None and (now - newest).total_seconds() <= (r.max_age_seconds or 0)


def freshness_outcome(r: Rule, newest: dt.datetime | None, now: dt.datetime, stale: int, total: int,
                      sample: list[dict[str, Any]], counted_from: str) -> CheckOutcome:
    """A `freshness` rule's outcome from the newest instant (naive UTC) and the stale rows (counted
    only when it fails), whichever engine found them."""
    age = (now - newest).total_seconds() if newest is not None else None
    return CheckOutcome(r, is_fresh(r, newest, now), stale, total, describe(r), sample,
                        message=(f"newest {r.column} is {newest} ({age:.0f}s old, limit {r.max_age_seconds}s)"
                                 if age is not None else f"no {r.column} values"),
                        details={"newest": str(newest), "age_seconds": age, "counted_from": counted_from})


def action_outcome(r: Rule, actions: ActionCounts) -> CheckOutcome:
    """A drop/quarantine rule's outcome from the counts of the split its rows went through."""
    if r.name in actions.errors:
        return CheckOutcome(r, False, 0, actions.total, describe(r), message=actions.errors[r.name],
                            details={"error": actions.errors[r.name]})
    failed = actions.failed.get(r.name, 0)
    verb = "quarantined" if r.action == "quarantine" else "dropped"
    return CheckOutcome(
        r, failed == 0, failed, actions.total, describe(r), actions.samples.get(r.name, [])[:SAMPLE_ROWS],
        f"{failed} of {actions.total} input rows fail {r.name} and were {verb}" if failed
        else f"all {actions.total} input rows pass", details={"action": r.action, verb: failed})


def dataset_rule(df: DataFrame | None, r: Rule, total: int, context: dict[str, Any], nulls: dict[str, int]
                 ) -> CheckOutcome:
    """A dataset rule's outcome; row_count and row_count_change need no rows (`df` None: another
    engine's audit, lakehouse.engines.arrow, which imports no pyspark for these two)."""
    expr = describe(r)
    if r.type == "row_count":
        ok = (r.min is None or total >= float(r.min)) and (r.max is None or total <= float(r.max))
        return CheckOutcome(r, ok, 0, total, expr, message=f"{total} rows loaded" + ("" if ok else
                            f", outside [{r.min if r.min is not None else '-inf'}, {r.max if r.max is not None else 'inf'}]"),
                            details={"row_count": total, "min": r.min, "max": r.max,
                                     "counted_from": context.get("_total_from", "rows")})
    if r.type == "row_count_change":
        prev = context.get("previous_row_count")
        after = context.get("row_count_after", total)
        if not prev:
            return CheckOutcome(r, True, 0, total, expr, message="no previous snapshot on main to compare with",
                                details={"previous_rows": prev, "rows": after})
        change = abs(after - prev) * 100.0 / prev
        ok = change <= float(r.max_change_pct or 0)
        return CheckOutcome(r, ok, 0, total, expr,
                            message=f"row count changed {change:.1f}% ({prev} -> {after}), limit {r.max_change_pct}%",
                            details={"change_pct": round(change, 3), "previous_rows": prev, "rows": after})
    from pyspark.sql import functions as F

    if r.type == "freshness":
        _require_columns(df.columns, r, [r.column])
        known = context.get("_newest", {})
        newest = known[r.column] if r.column in known else \
            _from_epoch(df.agg(F.max(_col(r.column).cast("timestamp").cast("double"))).collect()[0][0])
        now = context.get("now") or dt.datetime.now(dt.UTC).replace(tzinfo=None)
        stale = 0
        sample: list[dict[str, Any]] = []
        if not is_fresh(r, newest, now) and total:
            late = df.where(F.expr(predicates.stale_predicate(r, df.columns, freshness_cutoff(r, now))
                                   .sql(dialect="spark")))
            stale = late.count()
            sample = _sample(late)
        return freshness_outcome(r, newest, now, stale, total, sample,
                                 context.get("_newest_from", {}).get(r.column, "rows"))
    if r.type == "schema_contract":
        drift = context.get("schema_drift", {}).get(r.name) or schema_drift(df, r)
        return contract_outcome(r, drift, total, {c.name: nulls.get(c.name, 0) for c in r.expected_columns
                                                  if not c.nullable})
    if r.type == "unique":
        table = context.get("table", df)
        _require_columns(table.columns, r, r.columns)
        present = None
        for c in r.columns:  # SQL UNIQUE semantics: NULL keys are not duplicates (not_null covers them)
            p = _col(c).isNotNull()
            present = p if present is None else present & p
        rows = table.where(present)
        if context.get("unique_scoped") and df is not None and df is not table:
            # the write replaced rows where it says (a merge, a partition overwrite): only the keys it
            # wrote can have become duplicates; they are checked against every row of the table, which
            # is read through their pruning predicate, not in full (lakehouse.stage.pruning)
            from lakehouse.stage.pruning import KeyScope

            mine = df.where(present)
            rows = rows.where(KeyScope.collect(mine, r.columns).column()).join(
                mine.select(*[_col(c).alias(c) for c in r.columns]).distinct(), list(r.columns), "left_semi")
        dup = (rows.groupBy(*[_col(c) for c in r.columns]).agg(F.count(F.lit(1)).alias("__rows"))
               .where("__rows > 1"))
        counted = context.get("_unique_counts", {}).get(r.name) if df is table else None
        if counted is None:
            stats = dup.agg(F.coalesce(F.sum("__rows"), F.lit(0)), F.count(F.lit(1))).collect()[0]
            counted = int(stats[0]), int(stats[1])
        dups, keys = counted
        sample = _sample(dup.withColumnRenamed("__rows", "rows")) if dups else []
        return unique_outcome(r, dups, keys, int(context.get("row_count_after", total)), sample)
    if r.type == "referential_integrity":
        ref_df = context.get("ref_frames", {}).get(r.ref_dataset)
        if ref_df is None:
            return CheckOutcome(r, False, 0, total, expr,
                                message=f"reference dataset {r.ref_dataset!r} is not a readable table")
        _require_columns(df.columns, r, r.columns)
        _require_columns(ref_df.columns, r, r.ref_columns)
        keys = ref_df.select(*[_col(rc).alias(f"__k{i}") for i, rc in enumerate(r.ref_columns)]).distinct()
        cond = None
        for i, c in enumerate(r.columns):
            part = _col(c) == F.col(f"__k{i}")
            cond = part if cond is None else cond & part
        present = None
        for c in r.columns:  # a NULL key is not an orphan (not_null says whether NULLs are allowed)
            p = _col(c).isNotNull()
            present = p if present is None else present & p
        orphans = df.where(present).join(keys, cond, "left_anti")
        n = orphans.count()
        return CheckOutcome(r, n == 0, n, total, expr, _sample(orphans) if n else [],
                            f"{n} row(s) reference keys missing from {r.ref_dataset}" if n else "all keys found")
    raise RuleError(f"rule {r.name!r}: unknown dataset rule type {r.type}")
