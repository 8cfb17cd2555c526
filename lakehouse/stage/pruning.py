"""Predicates that let Iceberg skip files, so a write that touches few rows costs what it touches.

An incremental merge, its audit and a `unique` rule's check of the merged keys all ask "the rows of
this (large) table whose key is one of these (few)". A join with the change set answers that by
reading every file of the table; a predicate of literals answers it from the manifests, because
Iceberg prunes files whose column bounds exclude it (Spark pushes a target-only conjunct of a MERGE's
ON condition into the target's scan too). `KeyScope` builds that predicate from the keys of a small
frame: per key column, the sorted distinct values as at most `MAX_RANGES` ranges (what Iceberg's
metrics evaluator can use; it gives up on an IN list above 200 values) AND, up to `MAX_IN_VALUES`
values, the exact IN list (what Spark filters the rows with). The predicate selects the rows with
those keys, never fewer (beyond MAX_IN_VALUES keys, every row within their bounds: more).

`day_ranges` does the same for a partition recompute reading whole days of its upstream through an
expression such as `CAST(event_ts AS DATE)`, which Spark cannot push down: the days become ranges
of the timestamp column itself, which Iceberg prunes by partition and by file bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.sql.text import quote

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: ranges per key column (each a pair of literals; Iceberg evaluates an OR of ranges file by file)
MAX_RANGES = 128
#: beyond this many distinct values of a key column, only the ranges are used
MAX_IN_VALUES = 20_000
#: key column types whose order is the same in Spark and in Iceberg's file bounds
_ORDERED = frozenset({"string", "byte", "short", "integer", "long", "date", "timestamp", "decimal"})


def _ref(qualifier: str, name: str) -> Column:
    from pyspark.sql import functions as F

    quoted = quote(name)
    return F.col(f"{qualifier}.{quoted}" if qualifier else quoted)


def _gap(a: Any, b: Any) -> tuple:
    """How far apart two sorted neighbours are (bigger: farther): numbers, days and times by their
    difference, text by where it first differs (a shorter common prefix is a wider gap)."""
    if isinstance(a, str):
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                return (-n, ord(y) - ord(x))
            n += 1
        return (-n, len(b) - len(a))
    if isinstance(a, datetime):
        return (0, (b - a).total_seconds())
    if isinstance(a, date):
        return (0, (b - a).days)
    return (0, float(b - a))


def _ranges(values: list) -> list[tuple[Any, Any]]:
    """Sorted distinct values as at most MAX_RANGES (first, last) runs, cut at the widest gaps:
    keys that lie together (new ids of one hour) share a range, a stray one (an old id sent again)
    gets its own instead of widening a range over the files between."""
    if len(values) <= MAX_RANGES:
        return [(v, v) for v in values]
    widest = sorted(range(1, len(values)), key=lambda i: _gap(values[i - 1], values[i]), reverse=True)
    cuts = sorted(widest[:MAX_RANGES - 1])
    starts = [0, *cuts]
    ends = [*cuts, len(values)]
    return [(values[a], values[b - 1]) for a, b in zip(starts, ends, strict=True)]


def _any(preds: list[Column]) -> Column:
    """OR of the predicates as a balanced tree (shallow for the optimizer), False for none."""
    from pyspark.sql import functions as F

    if not preds:
        return F.lit(False)
    while len(preds) > 1:
        preds = [preds[i] | preds[i + 1] if i + 1 < len(preds) else preds[i] for i in range(0, len(preds), 2)]
    return preds[0]


@dataclass(frozen=True)
class ColumnKeys:
    name: str
    ranges: tuple[tuple[Any, Any], ...]
    values: tuple | None  # None: too many for an IN list
    has_null: bool


@dataclass(frozen=True)
class KeyScope:
    """The keys of a frame, per column, as a pruning predicate (see the module docstring)."""

    columns: tuple[ColumnKeys, ...]
    empty: bool  # the frame had no rows: the predicate selects nothing

    @classmethod
    def collect(cls, df: DataFrame, keys: list[str] | tuple[str, ...]) -> KeyScope:
        """Read the distinct keys of `df` (small: a change set). A column of a type without an
        order shared with Iceberg gets no predicate (the scope is then wider, never wrong)."""
        from pyspark.sql import functions as F

        cols = []
        types = {f.name: f.dataType.typeName() for f in df.schema.fields}
        rows_seen = False
        for k in keys:
            if types.get(k) not in _ORDERED:
                continue
            distinct = df.select(_ref("", k).alias("k")).distinct()
            head = [r[0] for r in distinct.orderBy(F.col("k").asc_nulls_first()).limit(MAX_IN_VALUES + 1).collect()]
            rows_seen = rows_seen or bool(head)
            has_null = bool(head) and head[0] is None
            values = [v for v in head if v is not None]
            if len(head) <= MAX_IN_VALUES:
                cols.append(ColumnKeys(k, tuple(_ranges(values)), tuple(values), has_null))
            else:  # too many keys for a list: their bounds only
                lo, hi = distinct.agg(F.min("k"), F.max("k")).collect()[0]
                cols.append(ColumnKeys(k, ((lo, hi),), None, has_null))
        if not cols:  # no column could be scoped: only "some rows or none" is known
            rows_seen = bool(df.limit(1).collect())
        return cls(tuple(cols), not rows_seen)

    def column(self, qualifier: str = "") -> Column:
        """The predicate over the table's columns (`qualifier`: the table's alias in a statement)."""
        from pyspark.sql import functions as F

        if self.empty:
            return F.lit(False)
        pred = F.lit(True)
        for c in self.columns:
            ref = _ref(qualifier, c.name)
            within = _any([(ref == F.lit(lo)) if lo == hi else ((ref >= F.lit(lo)) & (ref <= F.lit(hi)))
                           for lo, hi in c.ranges])
            if c.values is not None:  # the set first: a row failing it skips the ranges (Spark evaluates in order)
                within = ref.isin(list(c.values)) & within if c.values else F.lit(False)
            pred = pred & ((within | ref.isNull()) if c.has_null else within)
        return pred

    def sql(self, qualifier: str) -> str:
        """The predicate as Spark SQL text (a MERGE's ON condition): Spark renders it, every value as
        a typed, escaped literal."""
        return pyspark_compat.column_sql(self.column(qualifier))


def bloom_filter_properties(keys: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Table properties giving every Parquet row group a bloom filter of the merge keys. Key ranges
    cannot skip a file whose keys are spread (an old id sent again may sit in any day's file, late
    events put new ids into old days); the bloom filter can: Iceberg's reader skips each row group
    whose filter has none of the IN list's keys, reading a few kilobytes instead of the rows."""
    return {f"write.parquet.bloom-filter-enabled.column.{k}": "true" for k in keys}


def day_column(expression: str | None, column: str | None) -> str | None:
    """The column whose day an upstream partition expression is: `CAST(c AS DATE)`, `to_date(c)`,
    `date(c)` or the bare column `c` (None: any other expression, read without ranges)."""
    import sqlglot
    from sqlglot import exp

    if not expression:
        return column
    try:
        node = sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError:
        return None
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Cast | exp.TryCast) and node.to.is_type(exp.DataType.Type.DATE):
        inner = node.this
    elif isinstance(node, exp.TsOrDsToDate | exp.Date) and not node.args.get("format") and not node.expressions:
        inner = node.this  # to_date(c) / date(c); with a format it parses text, which is not a range
    else:
        return None
    return inner.name if isinstance(inner, exp.Column) and not inner.table else None


def day_ranges(df: DataFrame, column: str | None, days: list) -> Column | None:
    """`column` within the given days, as one range per run of consecutive days, or None when the
    column is not a date or timestamp of `df` (the caller's exact filter then reads everything)."""
    from pyspark.sql import functions as F

    field = next((f for f in df.schema.fields if column and f.name.lower() == column.lower()), None)
    if field is None or field.dataType.typeName() not in ("date", "timestamp", "timestamp_ntz"):
        return None
    ds = sorted({d for d in days if isinstance(d, date) and not isinstance(d, datetime)})  # days, not hours
    if len(ds) < len([d for d in days if d is not None]) or not ds:
        return None  # values that are not days: no ranges
    runs: list[list[date]] = []
    for d in ds:
        if runs and d == runs[-1][1] + timedelta(days=1):
            runs[-1][1] = d
        else:
            runs.append([d, d])
    ref, dtype = _ref("", field.name), field.dataType
    # [first 00:00, last + 1 day 00:00) in the session's time zone, as CAST(... AS DATE) counts days
    pred = _any([(ref >= F.lit(first.isoformat()).cast(dtype))
                 & (ref < F.lit((last + timedelta(days=1)).isoformat()).cast(dtype)) for first, last in runs])
    if None in days:
        pred = pred | ref.isNull()
    return pred
