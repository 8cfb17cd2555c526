"""Row-rule answers from Iceberg's file statistics, without reading a row.

Every data file Iceberg writes carries, per column, a NULL count, a NaN count and lower/upper
bounds in its manifest entry. Over the files a run added, those give the row count, `not_null`,
numeric `range`, the newest value for `freshness` and a contract's NULL counts, exactly,
whenever the data passes (and for most failures). Reading a few manifests takes milliseconds,
where evaluating the same rules spends CPU on every row written. A statistic that is missing (metrics mode `none` or `counts`, columns past
`write.metadata.metrics.max-inferred-column-defaults`) or a failure whose exact count the bounds
cannot give leaves its key unanswered, and the audit counts that key on the rows instead.

Keys are those of `RowPass`: `total`, `f:<rule>` (failing rows), `n:<column>` (NULLs),
`m:<column>` (newest value, epoch seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from lakehouse.validation.rules import RowPass
_MICROS = 1_000_000
_DAY = 86_400


@dataclass
class ColumnStats:
    """One column's statistics summed over files; None where some file lacks the statistic."""

    kind: str  # "number", "float" (has NaN counts), "time_us" (micros), "date" (days) or "other"
    nulls: int | None = 0
    nans: int | None = 0
    lower: Any = None
    upper: Any = None
    bounded: bool = True  # every file holding a non-NULL value also holds bounds


def _kind(iceberg_type) -> str:
    from pyiceberg import types as it

    if isinstance(iceberg_type, (it.FloatType, it.DoubleType)):
        return "float"
    if isinstance(iceberg_type, (it.IntegerType, it.LongType, it.DecimalType)):
        return "number"
    if isinstance(iceberg_type, (it.TimestampType, it.TimestamptzType)):
        return "time_us"
    if isinstance(iceberg_type, it.DateType):
        return "date"
    return "other"


@dataclass
class FileMetrics:
    """Statistics of a set of data files, by lower-cased top-level column name."""

    rows: int = 0
    columns: dict[str, ColumnStats] = field(default_factory=dict)

    @classmethod
    def from_data_files(cls, schema, files) -> FileMetrics:
        """`schema`: the PyIceberg table schema; `files`: PyIceberg `DataFile`s (data, not deletes)."""
        from pyiceberg.conversions import from_bytes

        fields = {}
        for f in schema.fields:
            if f.field_type.is_primitive:
                fields.setdefault(f.name.lower(), []).append(f)
        out = cls()
        by_id = {}
        for name, same in fields.items():
            if len(same) == 1:  # a name that differs only by case is ambiguous for Spark too
                out.columns[name] = ColumnStats(_kind(same[0].field_type))
                by_id[same[0].field_id] = (out.columns[name], same[0].field_type)
        for data_file in files:
            out.rows += data_file.record_count
            nulls, nans = data_file.null_value_counts or {}, data_file.nan_value_counts or {}
            lowers, uppers = data_file.lower_bounds or {}, data_file.upper_bounds or {}
            for fid, (st, ftype) in by_id.items():
                n = nulls.get(fid)
                st.nulls = None if n is None or st.nulls is None else st.nulls + n
                if st.kind == "float":
                    nan = nans.get(fid)
                    st.nans = None if nan is None or st.nans is None else st.nans + nan
                if st.kind == "other":
                    continue
                if fid in lowers and fid in uppers:
                    lo, hi = from_bytes(ftype, lowers[fid]), from_bytes(ftype, uppers[fid])
                    st.lower = lo if st.lower is None else min(st.lower, lo)
                    st.upper = hi if st.upper is None else max(st.upper, hi)
                elif n is None or n < data_file.record_count:
                    st.bounded = False  # values without bounds (or unknown whether any values)
        return out

    def answer(self, row_pass: RowPass) -> dict[str, Any]:
        """The keys of `row_pass` these statistics decide exactly; the others are left out."""
        out: dict[str, Any] = {"total": self.rows}
        for col in row_pass.not_nullable:
            st = self.columns.get(col.lower())
            if st is not None and st.nulls is not None:
                out[f"n:{col}"] = st.nulls
        for col in row_pass.fresh_cols:
            newest = self._newest(col)
            if newest is not False:
                out[f"m:{col}"] = newest
        for name, rule in row_pass.rules.items():
            failed = self._failed(rule)
            if failed is not None:
                out[f"f:{name}"] = failed
        return out

    def _newest(self, col: str) -> float | None | bool:
        """Newest value as epoch seconds, None when every value is NULL, False when unknown."""
        st = self.columns.get(col.lower())
        if st is None or st.kind not in ("time_us", "date") or not st.bounded:
            return False
        if st.upper is None:
            return None if st.nulls == self.rows else False
        return st.upper / _MICROS if st.kind == "time_us" else float(st.upper * _DAY)

    def _failed(self, rule) -> int | None:
        if rule.type == "not_null":
            stats = [self.columns.get(c.lower()) for c in rule.columns]
            if any(st is None or st.nulls is None for st in stats):
                return None
            with_nulls = [st.nulls for st in stats if st.nulls]
            # rows failing = rows with a NULL in any column: exact only when one column has NULLs
            return 0 if not with_nulls else (with_nulls[0] if len(with_nulls) == 1 else None)
        if rule.type == "range" and rule.column and _numeric_bounds(rule):
            st = self.columns.get(rule.column.lower())
            if st is None or st.kind not in ("number", "float") or st.nulls is None or st.nans != 0 \
                    or not st.bounded:
                return None
            if st.upper is None:  # no values: every row is NULL, and NULL fails a range
                return st.nulls if st.nulls == self.rows else None
            inside = (rule.min is None or st.lower >= rule.min) and (rule.max is None or st.upper <= rule.max)
            return st.nulls if inside else None  # outside: how many rows are outside needs the rows
        return None


def _numeric_bounds(rule) -> bool:
    return all(v is None or (isinstance(v, Real) and not isinstance(v, bool)) for v in (rule.min, rule.max))


def answerable_keys(row_pass: RowPass, schema: pa.Schema) -> set[str]:
    """Keys file statistics can decide for data that passes, from the frame's schema alone (the
    platform's type model, Arrow: the Spark engine converts its frame's schema at its edge): what
    needs no per-row evaluation while writing when the statistics will be read afterwards."""
    import pyarrow as pa

    types = {f.name.lower(): f.type for f in schema}

    def numeric(c: str | None) -> bool:
        t = types.get((c or "").lower())
        return t is not None and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))

    def instant(c: str) -> bool:
        t = types.get(c.lower())
        return t is not None and (pa.types.is_timestamp(t) or pa.types.is_date(t))

    keys = {"total", *(f"n:{c}" for c in row_pass.not_nullable)}
    keys |= {f"m:{c}" for c in row_pass.fresh_cols if instant(c)}
    for name, rule in row_pass.rules.items():
        if rule.type == "not_null" or (rule.type == "range" and _numeric_bounds(rule) and numeric(rule.column)):
            keys.add(f"f:{name}")
    return keys
