"""Arrow data conformed to a schema: columns matched by name case-insensitively, cast, text read as
timestamps and dates the way Spark's readers read it (the Arrow twin of lakehouse.ingest.prepare.conform)."""

from __future__ import annotations

import datetime as dt
import re

import pyarrow as pa
import pyarrow.compute as pc


def _conform_array(arr: pa.Array, want: pa.DataType) -> pa.Array:
    """`arr` as type `want`: struct fields matched by name case-insensitively (NULL for missing),
    lists element-wise, anything else cast."""
    if arr.type == want:
        return arr
    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([_conform_array(c, want) for c in arr.chunks], type=want)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), want)
    if pa.types.is_struct(want) and pa.types.is_struct(arr.type):
        by_name = {arr.type.field(i).name.lower(): i for i in range(arr.type.num_fields)}
        children = []
        for f in want:
            i = by_name.get(f.name.lower())
            children.append(pa.nulls(len(arr), f.type) if i is None else _conform_array(arr.field(i), f.type))
        return pa.StructArray.from_arrays(children, fields=list(want), mask=arr.is_null())
    if pa.types.is_list(want) and (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        values = _conform_array(arr.values, want.value_type)
        return pa.ListArray.from_arrays(pa.array(arr.offsets, pa.int32()), values, type=want, mask=arr.is_null())
    if (pa.types.is_timestamp(want) or pa.types.is_date(want)) and pa.types.is_string(arr.type):
        return _parse_times(arr, want)
    return arr.cast(want)


def _parse_times(arr: pa.Array, want: pa.DataType) -> pa.Array:
    """Text as timestamps or dates the way Spark's readers take it (the probe checked every value
    with lakehouse.ingest.spark_datetime): Arrow's ISO parser first, text without a zone being UTC
    (the session time zone); what it refuses ("2024-1-1", "... UTC") value by value with Spark's grammar."""
    text = arr
    if pa.types.is_timestamp(want) and want.tz is not None:
        zoned = pc.match_substring_regex(arr, r"(Z|[+-]\d\d(:?\d\d)?)$")
        text = pc.if_else(pc.fill_null(zoned, True), arr, pc.binary_join_element_wise(arr, "Z", ""))
    try:
        return text.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if pa.types.is_date(want):
        return pa.array([None if v is None else _spark_date(v) for v in arr.to_pylist()], pa.date32()).cast(want)
    micros = [None if v is None else _spark_micros(v, want.tz is not None) for v in arr.to_pylist()]
    return pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz=want.tz)).cast(want)


def _spark_micros(text: str, zoned: bool) -> int:
    """Microseconds since the epoch of `text` by Spark's stringToTimestamp (UTC session zone)."""
    from lakehouse.ingest import spark_datetime as sd

    for t in dict.fromkeys((text, text.replace("GMT", ""))) if zoned else (text,):
        parsed = sd._timestamp_segments(t)
        if parsed is None or parsed[2] or not sd._datetime_ok(parsed[0]):
            continue
        seg, zone = parsed[0], parsed[1]
        y, mo, d, h, mi, s, us = seg[:7]
        micros = sd._days_from_civil(y, mo, d) * 86_400_000_000 + ((h * 60 + mi) * 60 + s) * 1_000_000 + us
        if zone is None:
            return micros
        offset = _zone_offset_s(zone, dt.datetime(y, mo, d, h, mi, s)) if zoned else None
        if offset is not None:
            return micros - offset * 1_000_000
    raise ValueError(f"the Arrow engine cannot read {text!r} as a {'timestamp' if zoned else 'timestamp_ntz'}; "
                     "set the target's engine to spark")


def _zone_offset_s(zone: str, local: dt.datetime) -> int | None:
    """Seconds east of UTC of a zone Spark accepts: Z / UTC / GMT / UT, ±hh[:mm[:ss]] after an optional
    UTC / GMT / UT, or a region (None: a zone this reader does not know, e.g. Java's short ids)."""
    import zoneinfo

    if zone in ("Z", "UTC", "GMT", "UT"):
        return 0
    m = re.fullmatch(r"(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?", zone)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        return sign * (int(m.group(2)) * 3600 + int(m.group(3) or 0) * 60 + int(m.group(4) or 0))
    try:
        return int(zoneinfo.ZoneInfo(zone).utcoffset(local).total_seconds())
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OverflowError):
        return None


def _spark_date(text: str) -> dt.date:
    """A date by Spark's stringToDate: [+-]yyyy[-[m]m[-[d]d]], anything after " " or "T" ignored."""
    m = re.fullmatch(r"\s*([+-]?\d{4,7})(?:-(\d{1,2})(?:-(\d{1,2}))?)?(?:[ T].*)?\s*", text.replace("GMT", ""))
    try:
        return dt.date(int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1))
    except (AttributeError, ValueError):
        raise ValueError(f"the Arrow engine cannot read {text!r} as a date; set the target's engine to spark") from None


def conform(table: pa.Table, want: pa.Schema) -> pa.Table:
    """`table` as exactly `want`: columns matched by name case-insensitively, cast, NULL for what
    it lacks (the Arrow twin of lakehouse.ingest.prepare.conform)."""
    by_name = {n.lower(): n for n in table.column_names}
    cols, names = [], []
    for f in want:
        src = by_name.get(f.name.lower())
        cols.append(pa.nulls(table.num_rows, f.type) if src is None else _conform_array(table.column(src), f.type))
        names.append(f.name)
    return pa.table(cols, names=names)

