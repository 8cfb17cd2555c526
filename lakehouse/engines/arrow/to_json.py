"""Spark's `to_json` and `cast(... AS string)` on Arrow data, value for value (issue 21).

entity_raw's `raw_record` is the whole raw row as JSON text, and the warehouse export writes nested
columns as JSON text: the Arrow engine must produce the very text Spark's JacksonGenerator does, or
a table loaded turn and turn about by both engines would hold two spellings of the same record.
What Spark 3.5 writes (session time zone UTC, default JSON options): struct fields in order, NULL
fields left out (`spark.sql.jsonGenerator.ignoreNullFields`), NULL list elements and map values as
`null`; doubles and floats as Java's `Double/Float.toString`, NaN and infinities quoted; decimals
as `BigDecimal.toString`; timestamps `yyyy-MM-dd'T'HH:mm:ss.SSS` (+ `XXX` for zoned ones, `Z` in
UTC); dates ISO; binary as base64; Jackson's escapes (short ones, `\\u00XX` for other controls,
non-ASCII kept).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Callable
from typing import Any

import pyarrow as pa

_ESC = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESC.update({chr(i): f"\\u{i:04X}" for i in range(0x20) if chr(i) not in _ESC})
_TRANS = str.maketrans(_ESC)


def json_string(s: str) -> str:
    return '"' + s.translate(_TRANS) + '"'


def java_double(x: float, single: bool = False) -> str:
    """Java's Double.toString (Float.toString for `single`): shortest digits that round-trip,
    plain between 1e-3 and 1e7, else `d.dddE±n`."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if str(x).startswith("-") else "0.0"
    if single:
        import numpy as np

        text = np.format_float_scientific(np.float32(x), unique=True, trim="-")
    else:
        text = repr(x)
    sign, digits, exp = decimal.Decimal(text).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    point = len(digits) + exp  # the decimal point sits after `point` digits of `digits`
    # digits stripped of trailing zeros keep the same point
    neg = "-" if sign else ""
    if 1e-3 <= abs(x) < 1e7:
        if point <= 0:
            return f"{neg}0.{'0' * -point}{ds}"
        whole, frac = ds[:point].ljust(point, "0"), ds[point:]
        return f"{neg}{whole}.{frac or '0'}"
    return f"{neg}{ds[0]}.{ds[1:] or '0'}E{point - 1}"


def _timestamp(v: dt.datetime, zoned: bool) -> str:
    text = v.strftime("%Y-%m-%dT%H:%M:%S") + f".{v.microsecond // 1000:03d}"
    if not zoned:
        return text
    off = v.utcoffset() or dt.timedelta(0)
    if not off:
        return text + "Z"
    secs = int(off.total_seconds())
    sign, secs = ("+" if secs >= 0 else "-"), abs(secs)
    return f"{text}{sign}{secs // 3600:02d}:{secs % 3600 // 60:02d}"


def _decimal(v: decimal.Decimal) -> str:
    """Java's BigDecimal.toString: scientific only when the exponent is positive or the adjusted exponent < -6."""
    return str(v).replace("e", "E")


def encoder(t: pa.DataType) -> Callable[[Any], str]:
    """value (as `to_pylist` gives it, not None) -> its JSON text as Spark's to_json writes it."""
    pt = pa.types
    if pt.is_dictionary(t):
        return encoder(t.value_type)
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_string_view(t):
        return json_string
    if pt.is_boolean(t):
        return lambda v: "true" if v else "false"
    if pt.is_integer(t):
        return str
    if pt.is_floating(t):
        single = pt.is_float32(t) or pt.is_float16(t)

        def num(v: float) -> str:
            text = java_double(v, single)
            return f'"{text}"' if text[-1] in "Ny" else text  # NaN / Infinity are quoted by Jackson
        return num
    if pt.is_decimal(t):
        return _decimal
    if pt.is_timestamp(t):
        zoned = t.tz is not None
        return lambda v: '"' + _timestamp(v, zoned) + '"'
    if pt.is_date(t):
        return lambda v: '"' + v.isoformat() + '"'
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t):
        return lambda v: '"' + base64.b64encode(v).decode("ascii") + '"'
    if pt.is_struct(t):
        fields = [(json_string(t.field(i).name), t.field(i).name, encoder(t.field(i).type)) for i in range(t.num_fields)]

        def struct(v: dict) -> str:
            return "{" + ",".join(f"{k}:{enc(v[n])}" for k, n, enc in fields if v.get(n) is not None) + "}"
        return struct
    if pt.is_map(t):
        key, item = encoder(t.key_type), encoder(t.item_type)
        key_text = (lambda k: json_string(k)) if pt.is_string(t.key_type) else (lambda k: json_string(_unquoted(key(k))))
        return lambda v: "{" + ",".join(f"{key_text(k)}:{'null' if x is None else item(x)}" for k, x in v) + "}"
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        item = encoder(t.value_type)
        return lambda v: "[" + ",".join("null" if x is None else item(x) for x in v) + "]"
    if pt.is_null(t):
        return lambda v: "null"
    raise ValueError(f"no JSON encoding for Arrow type {t}")


def _unquoted(text: str) -> str:
    return text[1:-1] if text.startswith('"') else text


def to_json_rows(table: pa.Table, columns: list[str]) -> pa.Array:
    """Spark's `to_json(struct(columns...))` per row of `table`: NULL columns left out, `{}` at least."""
    encs = [(json_string(c), encoder(table.schema.field(c).type), table.column(c).to_pylist()) for c in columns]
    out = []
    for i in range(table.num_rows):
        out.append("{" + ",".join(f"{k}:{enc(vals[i])}" for k, enc, vals in encs if vals[i] is not None) + "}")
    return pa.array(out, pa.string())


def to_json_column(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Spark's `to_json(column)` of a nested column (NULL stays NULL)."""
    enc = encoder(arr.type)
    return pa.array([None if v is None else enc(v) for v in arr.to_pylist()], pa.string())


def cast_string(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Spark's `CAST(column AS string)` for the scalar types an entity name can have."""
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr.cast(pa.string())
    if pa.types.is_dictionary(t):
        return cast_string(arr.cast(t.value_type))
    enc = encoder(t)
    return pa.array([None if v is None else _unquoted(enc(v)) for v in arr.to_pylist()], pa.string())
