"""Probing one landing file in plain Python, before Spark reads it: can it be read, is it within
its source's limits, and what are its own columns and types.

* parquet: the footer only (pyarrow); the Spark types are resolved later from the footer schema
  (`lakehouse.ingest.prepare`), once per distinct footer schema.
* JSON lines: every line is parsed (streaming, one line in memory at a time) and the file's schema
  is inferred with Spark's JSON rules (an int and a double make a double, anything else mixed makes
  a string, struct fields are merged by name) — so Spark never infers a schema from the data. A
  file up to `ARROW_PROBE_MAX_BYTES` is first given to pyarrow's reader, whose answer is kept only
  when the Python probe's could not differ (`_probe_jsonl_arrow`); otherwise the Python probe decides.
* CSV: decoded as UTF-8 (a BOM is fine), one field count throughout, the header's names; every
  column is a string unless the table or the declared columns give it a type, in which case each
  value is checked against that type here.

`expect` maps lower-cased top-level column names to the Spark type the file will be read as (the
table's or the declared type). A JSON or CSV value that cannot be read as that type quarantines
the file with the line and the column named, instead of failing the batch inside Spark.
"""

from __future__ import annotations

import bz2
import csv
import functools
import gzip
import io
import json
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from lakehouse.ingest import spark_datetime
from lakehouse.ingest.files import EMPTY, PROCESSED, QUARANTINED
from lakehouse.ingest.limits import (
    CODEC_SUFFIXES,
    SPARK_JSON_MAX_STRING,
    BoundedLines,
    LimitExceeded,
    arrow_shape,
    compression_of,
)

SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"


@dataclass
class FileProbe:
    """What probing found: a status, the reason when not readable, and the file's own schema."""

    status: str = PROCESSED
    error: str | None = None
    schema: Any = None  # pyspark StructType (JSON, CSV); None for parquet until Spark resolves the footer
    rows: int | None = None
    read_key: str = ""  # files with the same key are read together with one explicit schema
    header: list[str] = field(default_factory=list)  # CSV: the names in file order

    @classmethod
    def bad(cls, error: str) -> FileProbe:
        return cls(QUARANTINED, error)


def _zstd_open(path: Path, mode: str = "rb"):
    """A zstd file's content as a stream (pyarrow's codec: the Python standard library has none)."""
    import pyarrow as pa

    return pa.input_stream(str(path), compression="zstd")


#: how the probe reads a compressed file, by the codec its name gives (what Spark and pyarrow read
#: by the same name: lakehouse.engines.arrow.read decompresses the same codecs)
OPENERS = {"gzip": gzip.open, "bzip2": bz2.open, "zstd": _zstd_open}


def _opener(path: Path, head: bytes, name: str):
    """How to open the file's content: decompress by name (as Spark does), refuse compressed data
    under another name (Spark would read the compressed bytes as text)."""
    suffix = path.suffix.lower()
    codec = CODEC_SUFFIXES.get(suffix)
    found = compression_of(head)
    if codec in OPENERS:
        if found and found != codec:
            return None, (f"the file name {name!r} says {codec} but the content is {found}-compressed: "
                          "rename it to match its codec, or decompress it")
        return OPENERS[codec], None
    if codec:
        return None, f"{codec}-compressed files are not probed; decompress them or use .gz, .bz2 or .zst"
    if found:
        return None, (f"the content is {found}-compressed but the file name {name!r} does not say so "
                      f"(Spark picks the codec from the name): rename it to end in .gz, or decompress it")
    return open, None


def probe_file(path: str | Path, fmt: str, *, limits, csv_header: bool = True,
               expect: dict[str, Any] | None = None, declared_names: list[str] | None = None,
               name: str | None = None) -> FileProbe:
    """Probe one file; never raises for bad content (the reason is in the result). `name` is the
    file's name in its source (a staged copy's own name is opaque)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(8)
        if fmt == "parquet":
            return _probe_parquet(p, head, limits)
        opener, why = _opener(p, head, (name or p.name).rsplit("/", 1)[-1])
        if why:
            return FileProbe.bad(why)
        if fmt == "jsonl" and opener is open:
            fast = _probe_jsonl_arrow(p, limits, expect or {})
            if fast is not None:
                return fast
        with opener(p, "rb") as fh:
            if fmt == "jsonl":
                return _probe_jsonl(fh, limits, expect or {})
            if fmt == "csv":
                return _probe_csv(fh, limits, expect or {}, csv_header, declared_names)
        raise ValueError(f"unsupported format {fmt!r}")
    except LimitExceeded as exc:
        return FileProbe.bad(f"over a limit: {exc}")
    except BadContent as exc:
        return FileProbe.bad(str(exc))
    except Exception as exc:  # noqa: BLE001 - any reader error means "unreadable"
        return FileProbe.bad(f"{type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- parquet


def _probe_parquet(p: Path, head: bytes, limits) -> FileProbe:
    import pyarrow.parquet as pq

    if not head.startswith(b"PAR1"):
        found = compression_of(head)
        return FileProbe.bad("not a parquet file (no PAR1 magic at the start)"
                             + (f"; the content is {found}-compressed" if found else ""))
    try:
        md = pq.read_metadata(p)
    except Exception as exc:  # noqa: BLE001
        return FileProbe.bad(f"not a readable parquet file (truncated or corrupt footer): {exc}")
    arrow = md.schema.to_arrow_schema()
    if md.num_columns == 0 or len(arrow) == 0:
        return FileProbe.bad("parquet file has no columns")
    depth, fields = arrow_shape(arrow)
    if depth > limits.max_depth:
        raise LimitExceeded("max_depth", limits.max_depth, f"nesting depth {depth}")
    if fields > limits.max_columns:
        raise LimitExceeded("max_columns", limits.max_columns, f"{fields} fields")
    err = _name_problem([f.name for f in arrow], "")
    if err is None:
        err = _nested_name_problem(arrow)
    if err:
        return FileProbe.bad(err)
    if md.num_rows == 0:
        return FileProbe(EMPTY, "no rows", rows=0)
    spark_meta = (md.metadata or {}).get(SPARK_ROW_METADATA, b"")
    return FileProbe(rows=md.num_rows, read_key="parquet:" + _footer_key(md.schema)
                     + spark_meta.decode("utf-8", "replace"))


def _footer_key(schema) -> str:
    """A parquet footer schema as text that is equal for equal schemas: what Spark maps to its types
    (names, physical and logical types, repetition, nesting). `str()` of pyarrow's ParquetSchema
    starts with the object's address, which made every file its own read group: one Spark schema
    job and one scan per file instead of one per distinct schema."""
    text = str(schema)
    return text.partition("\n")[2] if text.startswith("<") else text


def _name_problem(names: list[str], where: str) -> str | None:
    """Empty names, or names equal but for case (Spark resolves names case-insensitively)."""
    seen: dict[str, str] = {}
    for n in names:
        if n == "":
            return f"an empty column name{where}"
        if n.lower() in seen:
            other = seen[n.lower()]
            return (f"duplicate column name {n!r}{where}" if other == n
                    else f"column names {other!r} and {n!r}{where} differ only in case")
        seen[n.lower()] = n
    return None


def _nested_name_problem(arrow) -> str | None:
    import pyarrow as pa

    def walk(t, path: str) -> str | None:
        if pa.types.is_struct(t):
            names = [t.field(i).name for i in range(t.num_fields)]
            err = _name_problem(names, f" in {path}")
            if err:
                return err
            return next((e for i in range(t.num_fields)
                         if (e := walk(t.field(i).type, f"{path}.{t.field(i).name}"))), None)
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return walk(t.value_type, f"{path}.element")
        if pa.types.is_map(t):
            return walk(t.item_type, f"{path}.value")
        return None

    return next((e for f in arrow if (e := walk(f.type, f.name))), None)


# --------------------------------------------------------------------------- JSON lines
# Inference state: primitive tags are strings; structs and arrays are mutable nodes.
NULL, BOOL, LONG, BIGINT, DOUBLE, STRING = "null", "boolean", "bigint", "decimal(38,0)", "double", "string"
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class BadContent(ValueError):
    """The file's content cannot be loaded; the message says where and why."""


def _short(path: str) -> str:
    return path if len(path) <= 60 else path[:28] + "…" + path[-28:]


class _Struct:
    __slots__ = ("fields", "lower")

    def __init__(self):
        self.fields: dict[str, Any] = {}
        self.lower: dict[str, str] = {}


class _Array:
    __slots__ = ("elem",)

    def __init__(self, elem: Any = NULL):
        self.elem = elem


class _Infer:
    """Merges parsed JSON values into one schema, checking the limits on the way."""

    def __init__(self, limits, is_json: bool = True):
        self.max_depth = limits.max_depth
        self.max_chars = min(limits.max_field_chars, SPARK_JSON_MAX_STRING) if is_json else limits.max_field_chars
        self.limit_name = "max_field_chars" + (" (Spark's JSON parser refuses more than 20,000,000)"
                                               if is_json and limits.max_field_chars > SPARK_JSON_MAX_STRING else "")
        self.max_columns = limits.max_columns
        self.columns = 0
        self.where = ""

    def merge(self, tag: Any, v: Any, depth: int, path: str) -> Any:
        """The tag of `tag` merged with value `v` (Spark's JSON inference: compatible numbers widen,
        structs merge by name, anything else conflicting becomes a string)."""
        if v is None:
            return tag if tag is not None else NULL
        t = type(v)
        if t is str:
            if len(v) > self.max_chars:
                raise LimitExceeded(self.limit_name, self.max_chars,
                                    f"a value of {len(v)} characters in {_short(path)}", self.where)
            new = STRING
        elif t is bool:
            new = BOOL
        elif t is int:
            new = LONG if _LONG_MIN <= v <= _LONG_MAX else (BIGINT if len(str(abs(v))) <= 38 else DOUBLE)
        elif t is float or t is Decimal:
            new = DOUBLE
        elif t is dict or t is list:
            if depth >= self.max_depth:
                raise LimitExceeded("max_depth", self.max_depth, f"nesting depth {depth + 1} at {_short(path)}",
                                    self.where)
            kind = _Struct if t is dict else _Array
            if tag is not None and tag != NULL and not isinstance(tag, kind):
                self._check(v, depth + 1, path)  # a conflict makes a string; the limits still apply inside
                return STRING
            node = tag if isinstance(tag, kind) else kind()
            if t is dict:
                self._absorb(node, v, depth + 1, path)
            else:
                for e in v:
                    node.elem = self.merge(node.elem, e, depth + 1, path + "[]")
            return node
        else:  # pragma: no cover - json.loads yields nothing else
            new = STRING
        if tag is None or tag == NULL or tag == new:
            return new
        if isinstance(tag, str) and {tag, new} <= {LONG, BIGINT, DOUBLE}:
            return DOUBLE if DOUBLE in (tag, new) else BIGINT
        return STRING

    def _check(self, v: Any, depth: int, path: str) -> None:
        """The depth and value-size limits over a value whose type is not inferred (a conflict)."""
        if isinstance(v, str):
            self.merge(None, v, depth, path)
        elif isinstance(v, (dict, list)):
            if depth >= self.max_depth:
                raise LimitExceeded("max_depth", self.max_depth, f"nesting depth {depth + 1} at {_short(path)}",
                                    self.where)
            for e in (v.values() if isinstance(v, dict) else v):
                self._check(e, depth + 1, path)

    def _absorb(self, node: _Struct, obj: dict, depth: int, path: str) -> None:
        fields = node.fields
        for k, v in obj.items():
            if k in fields:
                tag, t = fields[k], type(v)
                # fast path for most values: null, or the field's type again (no call, no new tag)
                if v is None or (t is str and tag is STRING and len(v) <= self.max_chars) or (
                        t is float and tag is DOUBLE) or (t is bool and tag is BOOL) or (
                        t is int and (tag is DOUBLE or (tag is LONG and _LONG_MIN <= v <= _LONG_MAX))):
                    continue
                fields[k] = self.merge(tag, v, depth, f"{path}.{k}" if path else k)
                continue
            where = f" in {path}" if path else ""
            if k == "":
                raise BadContent(f"{self.where}: an empty field name{where}")
            other = node.lower.get(k.lower())
            if other is not None:
                raise BadContent(f"{self.where}: field names {other!r} and {k!r}{where} differ only in case")
            self.columns += 1
            if self.columns > self.max_columns:
                raise LimitExceeded("max_columns", self.max_columns, f"more than {self.max_columns} fields",
                                    self.where)
            node.lower[k.lower()] = k
            fields[k] = self.merge(None, v, depth, f"{path}.{k}" if path else k)


def _spark_type(tag: Any):
    """Inference tag -> Spark type; None for a field with no value but null (added once it has one)."""
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DecimalType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    if isinstance(tag, _Struct):
        fields = [StructField(k, t) for k, v in tag.fields.items() if (t := _spark_type(v)) is not None]
        return StructType(fields) if fields else None
    if isinstance(tag, _Array):
        elem = _spark_type(tag.elem)
        return None if elem is None else ArrayType(elem)
    if tag == NULL:
        return None
    return {BOOL: BooleanType(), LONG: LongType(), BIGINT: DecimalType(38, 0), DOUBLE: DoubleType(),
            STRING: StringType()}[tag]


def _probe_jsonl(fh, limits, expect: dict[str, Any]) -> FileProbe:
    from pyspark.sql.types import StructField, StructType

    infer = _Infer(limits)
    root = _Struct()
    checks = {k: _fitter(t) for k, t in expect.items()}
    checks = {k: f for k, f in checks.items() if f is not None}
    # one decoder for the file (json.loads with arguments builds a new one per call); decimals exact when checked
    decimals = any(getattr(t, "typeName", lambda: "")() == "decimal" for t in expect.values())
    decode = json.JSONDecoder(parse_float=Decimal).decode if decimals else json.JSONDecoder().decode
    rows = 0
    seen = root.lower  # lower-cased field name -> its spelling in the file
    reader = io.BufferedReader(BoundedLines(fh, limits.max_line_bytes), buffer_size=1 << 20)
    for n, raw in enumerate(reader, 1):
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        infer.where = f"line {n}"
        try:
            obj = decode(raw.decode("utf-8"))
        except RecursionError:
            raise LimitExceeded("max_depth", limits.max_depth, "nesting deeper than the JSON parser can follow",
                                infer.where) from None
        except UnicodeDecodeError as exc:
            return FileProbe.bad(f"line {n}: not UTF-8 text ({exc})")
        except ValueError as exc:
            return FileProbe.bad(f"line {n}: not valid JSON ({exc})")
        if type(obj) is not dict:
            return FileProbe.bad(f"line {n}: a JSON {type(obj).__name__}, not an object")
        try:
            infer._absorb(root, obj, 1, "")
        except RecursionError:
            raise LimitExceeded("max_depth", limits.max_depth, "nesting too deep", infer.where) from None
        # the checked columns only (a key's spelling in this line is the file's: `_absorb` refuses
        # names that differ only in case), not a lookup per field of every line
        for lk, fit in checks.items():
            k = seen.get(lk)
            v = obj.get(k) if k is not None else None
            if v is not None and not fit(v):
                return FileProbe.bad(f"line {n}: column {k}: value {_show(v)} cannot be read as "
                                     f"{expect[lk].simpleString()}")
        rows += 1
    if rows == 0:
        return FileProbe(EMPTY, "no JSON records", rows=0)
    fields = []
    for k, tag in root.fields.items():
        want = expect.get(k.lower()) if k.lower() in checks else None
        t = want if want is not None and tag != NULL else _spark_type(tag)
        if t is not None:
            fields.append(StructField(k, t))
    return FileProbe(schema=StructType(fields), rows=rows, read_key="jsonl")


#: files up to this size may be probed by pyarrow's JSON reader first: the whole file, its lines and
#: the parsed table are in memory at once (a few times the file's size); larger files stream
ARROW_PROBE_MAX_BYTES = 32 << 20
#: pyarrow parses blocks of this size in parallel (a block always holds whole lines); the result
#: is the one a single block gives (its type inference promotes across blocks)
ARROW_PROBE_BLOCK_BYTES = 1 << 20
#: every digit -> "0", anything else -> " ": a run of 19 zeros may be an integer past int64 (pyarrow
#: reads it as a double, Spark's inference as decimal(38,0)); a bytes search, not a regex, over the file
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))


def _probe_jsonl_arrow(p: Path, limits, expect: dict[str, Any]) -> FileProbe | None:
    """The JSON-lines probe in pyarrow's C++ reader: the same result as `_probe_jsonl` for a file
    that the Python probe accepts, or None to let that probe decide (it says what is wrong, with
    the line). Parsing every line in Python cost ~1.5 s of CPU per 100,000 lines, for both engines.

    It answers only when its verdict cannot differ from the Python probe's: no line over the limits,
    one JSON object per line, no type conflict (pyarrow refuses those; Spark's rules would make a
    string), no integer past int64, names distinct regardless of case, depth and field counts under
    the limits, no decimal column to check, and every value of a checked column accepted by the same
    predicate (`_fitter`, vectorised by `_arrow_fits`). The file is parsed once: the checked date and
    timestamp columns of its first line are read as text (pyarrow would take them for timestamps and
    lose their spelling)."""
    try:
        if p.stat().st_size > ARROW_PROBE_MAX_BYTES or any(
                getattr(t, "typeName", lambda: "")() == "decimal" for t in expect.values()):
            return None
        data = p.read_bytes()
        if not data or data.startswith(b"\xef\xbb\xbf"):
            return None
        data.decode("utf-8")  # pyarrow passes invalid UTF-8 through; Spark's reader would not (ValueError)
        shape = _line_shape(data)
        if shape is None:
            return None
        longest, records, first = shape
        max_chars = min(limits.max_field_chars, SPARK_JSON_MAX_STRING)
        if longest > limits.max_line_bytes or longest > max_chars:
            return None
        import pyarrow as pa
        import pyarrow.json as pjson

        block = len(data) + 1 if len(data) < 2 * ARROW_PROBE_BLOCK_BYTES else max(ARROW_PROBE_BLOCK_BYTES, 2 * longest + 2)

        def read(text_columns: list[str]) -> pa.Table:
            parse = pjson.ParseOptions(explicit_schema=pa.schema([(n, pa.string()) for n in text_columns]),
                                       unexpected_field_behavior="infer") if text_columns else None
            return pjson.read_json(pa.BufferReader(data), parse_options=parse,
                                   read_options=pjson.ReadOptions(block_size=block))

        fits = {k: t for k, t in expect.items() if _fitter(t) is not None}
        dated = {k for k, t in fits.items() if t.typeName() in _DATETIME_TEXT}
        text: list[str] = []
        if dated:  # their spelling in the file, from its first line (explicit columns come first: reordered below)
            keys = json.loads(first)
            if type(keys) is not dict:
                return None
            text = [k for k in keys if k.lower() in dated]
        try:
            table = read(text)
        except pa.ArrowInvalid:
            if not text:
                raise
            text = []  # a checked timestamp given as a JSON number: read as pyarrow infers
            table = read(text)
        stamped = [n for n, t in zip(table.column_names, table.schema.types, strict=True)
                   if n.lower() in fits and (pa.types.is_timestamp(t) or pa.types.is_date(t))]
        if stamped:  # checked columns pyarrow took for timestamps: read again as text (the spelling is checked)
            table = read(text + stamped).select(table.column_names)
        if text:  # the file's order: the first line's keys, then the others as pyarrow met them
            table = table.select(list(keys) + [n for n in table.column_names if n not in keys])
        if table.num_rows == 0 or table.num_rows != records:
            return None  # two objects on one line, or an empty file: the Python probe says so
        depth, count = arrow_shape(table.schema)
        if depth >= limits.max_depth or count >= limits.max_columns:
            return None
        if _name_problem(table.schema.names, "") or _nested_name_problem(table.schema):
            return None
        if any(_has_double(t) for t in table.schema.types) and b"0" * 19 in data.translate(_DIGITS):
            return None  # maybe an integer past int64, which pyarrow read as a double
        from pyspark.sql.types import StructField, StructType

        fields = []
        for name, column in zip(table.column_names, table.columns, strict=True):
            want = fits.get(name.lower())
            if want is not None:
                if column.null_count == len(column):
                    continue  # no value but null: no column (as the Python probe infers)
                if not _arrow_fits(column, want):
                    return None
                fields.append(StructField(name, want))
                continue
            t = _arrow_spark_type(column.type)
            if t is not None:
                fields.append(StructField(name, t))
        return FileProbe(schema=StructType(fields), rows=table.num_rows, read_key="jsonl")
    except Exception:  # noqa: BLE001 - anything unusual: the Python probe decides and explains
        return None


_BLANK = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips


def _line_shape(data: bytes) -> tuple[int, int, bytes] | None:
    """(longest line in bytes, lines holding a record, the first record's line) of a file, or None
    when a line is `null` (pyarrow takes it for an empty row; the Python probe refuses it) or no line
    holds anything. Every line starting with "{" is the common case, decided with numpy over the
    line ends; otherwise each line is stripped in Python."""
    import numpy as np

    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], ends + 1))
    ends = np.concatenate((ends, [len(data)]))
    if starts[-1] == len(data):  # the file ends with a newline: no last line
        starts, ends = starts[:-1], ends[:-1]
    if len(starts) and bool((buf[starts] == 0x7B).all()):  # every line starts with "{": none blank or null
        return int((ends - starts).max()), len(starts), data[:ends[0]]
    lines = data.split(b"\n")
    records = list(filter(None, map(bytes.strip, lines)))
    if not records or b"null" in records:
        return None
    return max(map(len, lines)), len(records), records[0]


def longest_line(data: bytes) -> int:
    """Bytes in the longest line of `data`, its newline included (numpy over the line ends)."""
    import numpy as np

    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    return int(np.diff(ends, prepend=-1, append=len(data)).max()) if len(data) else 0


def _has_double(t) -> bool:
    import pyarrow as pa

    if pa.types.is_floating(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_double(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_double(t.value_type)
    return False


# the strict core of Spark's date and timestamp grammar (`spark_datetime`), as an RE2 pattern that
# pyarrow runs over a whole column: a 4-digit year, a day that exists in every year (the 29th of
# February is left to the Python predicate), 24-hour time, up to 6 fraction digits, Z or an offset
# up to ±18:00. Every text it matches the predicate accepts (tests/test_probe_vectorised.py);
# what it does not match goes to the predicate, one distinct value at a time.
_RE_DATE = (r"[0-9]{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
            r"|(?:0[13578]|1[02])-31)")
_RE_TIME = r"[T ](?:[01][0-9]|2[0-3])(?::[0-5][0-9](?::[0-5][0-9](?:\.[0-9]{1,6})?%s)?)?"
_RE_ZONE = r"(?:Z|[+-](?:0[0-9]|1[0-7]):[0-5][0-9]|[+-]18:00)?"
_FAST_TEXT = {"timestamp": f"^{_RE_DATE}(?:{_RE_TIME % _RE_ZONE})?$",
              "timestamp_ntz": f"^{_RE_DATE}(?:{_RE_TIME % ''})?$",
              "date": f"^{_RE_DATE}(?:[T ].*)?$"}


def _arrow_fits(column, dtype) -> bool:
    """`_fitter(dtype)` over every non-null value of a pyarrow column, vectorised: integers by their
    minimum and maximum, dates and timestamps by `_FAST_TEXT` and the predicate for the rest; a
    column of another JSON type than the one `dtype` takes fails as one value of it would."""
    import pyarrow as pa
    import pyarrow.compute as pc

    name, t = dtype.typeName(), column.type
    if name in _INT_RANGES:
        if not pa.types.is_int64(t):
            return False
        bound = _INT_RANGES[name]
        low, high = pc.min_max(column).values()
        return -bound <= low.as_py() and high.as_py() < bound
    if name in ("double", "float"):
        return pa.types.is_int64(t) or pa.types.is_float64(t)
    if name == "boolean":
        return pa.types.is_boolean(t)
    if name in _FAST_TEXT:
        if name == "timestamp" and pa.types.is_int64(t):
            return True  # seconds since the epoch; every int64 is in range
        if not pa.types.is_string(t):
            return False
        rest = column.filter(pc.invert(pc.match_substring_regex(column, _FAST_TEXT[name])))
        fit = _fitter(dtype)
        return all(fit(v) for v in rest.unique().to_pylist())
    fit = _fitter(dtype)
    return all(fit(v) for v in column.unique().drop_null().to_pylist())


def _arrow_spark_type(t):
    """pyarrow's inferred JSON type -> the type Spark's JSON inference gives (text pyarrow read as a
    timestamp is a string to Spark); None for a field with no value but null."""
    import pyarrow as pa
    from pyspark.sql.types import ArrayType, BooleanType, DoubleType, LongType, StringType, StructField, StructType

    if pa.types.is_null(t):
        return None
    if pa.types.is_struct(t):
        fields = [StructField(t.field(i).name, ft) for i in range(t.num_fields)
                  if (ft := _arrow_spark_type(t.field(i).type)) is not None]
        return StructType(fields) if fields else None
    if pa.types.is_list(t):
        elem = _arrow_spark_type(t.value_type)
        return None if elem is None else ArrayType(elem)
    if pa.types.is_boolean(t):
        return BooleanType()
    if pa.types.is_int64(t):
        return LongType()
    if pa.types.is_float64(t):
        return DoubleType()
    if pa.types.is_string(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        return StringType()
    raise TypeError(f"unexpected inferred type {t}")


def _show(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- value checks (JSON, CSV)
_INT_RANGES = {"byte": 2**7, "short": 2**15, "integer": 2**31, "long": 2**63}


def _fitter(dtype, text: bool = False):
    """A predicate `value -> bool`: can Spark read this JSON value (or CSV text) as `dtype`? None when
    every value can (strings) or the type is not checked here."""
    name = dtype.typeName()
    if name == "string":
        return None
    if name in _INT_RANGES:
        bound = _INT_RANGES[name]
        if text:
            return lambda s: re.fullmatch(r"\s*[+-]?\d+\s*", s) is not None and -bound <= int(s) < bound
        return lambda v: type(v) is int and -bound <= v < bound
    if name in ("double", "float"):
        if text:
            return _is_float_text
        return lambda v: type(v) in (int, float, Decimal)
    if name == "decimal":
        return functools.partial(_fits_decimal, dtype.precision, dtype.scale)
    if name == "boolean":
        if text:
            return lambda s: s.strip().lower() in ("true", "false")
        return lambda v: type(v) is bool
    if name in _DATETIME_TEXT:
        readable = _DATETIME_TEXT[name]
        if text:
            return readable
        if name == "timestamp":  # a JSON integer is seconds since the epoch, for this type only
            bound = _INT_RANGES["long"]
            return lambda v: (type(v) is int and -bound <= v < bound) or (type(v) is str and readable(v))
        if name == "date":
            readable = spark_datetime.readable_as_json_date
        return lambda v: type(v) is str and readable(v)
    return None


_DATETIME_TEXT = {"timestamp": spark_datetime.readable_as_timestamp,
                  "timestamp_ntz": spark_datetime.readable_as_timestamp_ntz,
                  "date": spark_datetime.readable_as_date}


# java.math.BigDecimal's grammar: Spark's JSON and CSV readers parse a decimal given as text with it,
# after dropping ',' grouping separators (ExprUtils.getDecimalParser, default locale)
_BIG_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_WIDE = Context(prec=200)  # room for any decimal(38, s) and then some: rounding never inexact here


def _fits_decimal(precision: int, scale: int, v: Any) -> bool:
    """Can Spark read `v` — a JSON number, a JSON string ("12.50": Spark's JSON reader takes quoted
    decimals) or CSV text — as decimal(precision, scale)? As Spark does it: text parsed as
    java.math.BigDecimal (no spaces, no NaN), the value rounded half-up to the scale, then at most
    `precision` digits."""
    t = type(v)
    if t is str:
        text = v.replace(",", "")
        if _BIG_DECIMAL.fullmatch(text) is None:
            return False
        d = Decimal(text)
    elif t is int or t is Decimal:
        d = Decimal(v)
    elif t is float:
        d = Decimal(repr(v))
    else:  # a boolean, an object, an array
        return False
    if not d.is_finite():
        return False
    try:
        rounded = d.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=_WIDE)
    except InvalidOperation:  # far more digits than any decimal type holds
        return False
    return len(rounded.as_tuple().digits) <= precision


def _is_float_text(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# --------------------------------------------------------------------------- CSV


def _probe_csv(fh, limits, expect: dict[str, Any], header: bool, declared_names: list[str] | None) -> FileProbe:
    from pyspark.sql.types import StringType, StructField, StructType

    text = io.TextIOWrapper(io.BufferedReader(BoundedLines(fh, limits.max_line_bytes), buffer_size=1 << 20),
                            encoding="utf-8-sig", newline="")
    if csv.field_size_limit() < limits.max_field_chars + 1:
        csv.field_size_limit(limits.max_field_chars + 1)
    reader = csv.reader(text)
    names: list[str] | None = None
    fits: list = []
    width = None
    rows = 0
    try:
        for n, row in enumerate(reader, 1):
            if not row:
                continue
            if width is None:
                width = len(row)
                if width > limits.max_columns:
                    raise LimitExceeded("max_columns", limits.max_columns, f"{width} columns")
                if header:
                    names = [c if c != "" else f"_c{i}" for i, c in enumerate(row)]
                elif declared_names and len(declared_names) == width:
                    names = list(declared_names)
                else:
                    names = [f"_c{i}" for i in range(width)]
                err = _name_problem(names, " in the header")
                if err:
                    return FileProbe.bad(err)
                fits = [_fitter(expect[c.lower()], text=True) if c.lower() in expect else None for c in names]
                if header:
                    continue
            elif len(row) != width:
                return FileProbe.bad(f"row {n} has {len(row)} fields, expected {width} (truncated or malformed)")
            for i, value in enumerate(row):
                if len(value) > limits.max_field_chars:
                    raise LimitExceeded("max_field_chars", limits.max_field_chars,
                                        f"a value of {len(value)} characters in column {names[i]}", f"row {n}")
                fit = fits[i]
                if fit is not None and value != "" and not fit(value):
                    return FileProbe.bad(f"row {n}: column {names[i]}: value {_show(value)} cannot be read as "
                                         f"{expect[names[i].lower()].simpleString()}")
            rows += 1
    except UnicodeDecodeError as exc:
        return FileProbe.bad(f"not UTF-8 text ({exc})")
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise LimitExceeded("max_field_chars", limits.max_field_chars, "a longer value") from None
        return FileProbe.bad(f"not valid CSV: {exc}")
    if names is None:
        return FileProbe(EMPTY, "no rows", rows=0)
    typed = {c.lower() for c, fit in zip(names, fits, strict=True) if fit is not None}
    schema = StructType([StructField(c, expect[c.lower()] if c.lower() in typed else StringType()) for c in names])
    if rows == 0:
        return FileProbe(EMPTY, "only a header", rows=0, schema=schema, header=names)
    return FileProbe(schema=schema, rows=rows, read_key="csv:" + json.dumps(names), header=names)
