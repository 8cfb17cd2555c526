"""Write-audit-publish without a JVM: PyIceberg + Arrow for small file loads (issue 21, seed 001).

The same contract as the Spark engine, behind the same service (lakehouse.wap_service), for what
`lakehouse.engine.arrow_blockers` admits (files / staged S3 objects, append, Arrow-evaluable rules):

* files are probed and reconciled by the same code (`lakehouse.ingest.prepare.prepare_files`,
  with `ArrowSchemaIO` answering the table and footer questions through PyIceberg and pyarrow),
  read with pyarrow into exactly the reconciled schema, with `promote_fields` and the lineage
  columns `_source_file` / `_ingested_at` Spark would add;
* each batch is one PyIceberg append to the `audit_<run_id>` branch, carrying the same snapshot
  properties (file checkpoints, run id); rows failing a quarantine rule go to the quarantine
  table's branch with the same columns;
* the rules are evaluated with pyarrow.compute on the branch's own new files (row count from the
  snapshot summary), with the same outcomes and messages as `lakehouse.validation.rules`;
* publish, kill-switch re-check, conflict handling and exactly-once are the service's, unchanged
  (`lakehouse.publish` already works on PyIceberg metadata).

Types travel as Spark's `pyspark.sql.types` (plain Python, no JVM), because the shared probe and
reconciliation speak them; converters here map them to Arrow and Iceberg types the way Spark's
Iceberg integration does, so a table either engine creates is the same table.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.core import SQL
from lakehouse.iceberg import MAIN, IcebergTables, WriteResult, retry_metadata_commit
from lakehouse.ingest import files as file_ingest
from lakehouse.ingest.checkpoints import checked_files
from lakehouse.ingest.files import FileRef
from lakehouse.ingest.prepare import PreparedFiles, prepare_files
from lakehouse.ingest.probe import longest_line
from lakehouse.validation.quarantine import QuarantineWriter
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
    row_outcome,
)
from lakehouse.validation.wap import AuditedWrite

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

    from lakehouse.core import Batch, ExtractPlan, StageContext
    from lakehouse.metadata.model import Rule, Source, Target
    from lakehouse.platform import Platform

log = logging.getLogger(__name__)

UTC_US = pa.timestamp("us", tz="UTC")


# --------------------------------------------------------------------------- types


def spark_to_arrow(t: DataType) -> pa.DataType:
    """The Arrow type a Spark type is read and written as (Spark's own Arrow mapping, UTC)."""
    from pyspark.sql import types as T

    simple = {T.StringType: pa.string(), T.LongType: pa.int64(), T.IntegerType: pa.int32(),
              T.ShortType: pa.int16(), T.ByteType: pa.int8(), T.DoubleType: pa.float64(),
              T.FloatType: pa.float32(), T.BooleanType: pa.bool_(), T.DateType: pa.date32(),
              T.TimestampType: UTC_US, T.TimestampNTZType: pa.timestamp("us"), T.BinaryType: pa.binary(),
              T.NullType: pa.null()}
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, T.DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, T.ArrayType):
        return pa.list_(spark_to_arrow(t.elementType))
    if isinstance(t, T.MapType):
        return pa.map_(spark_to_arrow(t.keyType), spark_to_arrow(t.valueType))
    if isinstance(t, T.StructType):
        return pa.struct([pa.field(f.name, spark_to_arrow(f.dataType)) for f in t.fields])
    raise ValueError(f"no Arrow type for Spark type {t.simpleString()}")


def arrow_to_spark(t: pa.DataType) -> DataType:
    """Spark's type for an Arrow (parquet footer) type, as Spark's parquet reader maps it; raises
    for what Spark refuses (nanosecond timestamps), so the file is quarantined as Spark would."""
    from pyspark.sql import types as T

    pt = pa.types
    if pt.is_dictionary(t):
        return arrow_to_spark(t.value_type)
    if pt.is_boolean(t):
        return T.BooleanType()
    for test, out in ((pt.is_int8, T.ByteType), (pt.is_int16, T.ShortType), (pt.is_int32, T.IntegerType),
                      (pt.is_int64, T.LongType), (pt.is_uint8, T.ShortType), (pt.is_uint16, T.IntegerType),
                      (pt.is_uint32, T.LongType), (pt.is_float32, T.FloatType), (pt.is_float64, T.DoubleType),
                      (pt.is_date, T.DateType), (pt.is_null, T.NullType)):
        if test(t):
            return out()
    if pt.is_uint64(t):
        return T.DecimalType(20, 0)
    if pt.is_decimal(t):
        return T.DecimalType(t.precision, t.scale)
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_string_view(t):
        return T.StringType()
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t):
        return T.BinaryType()
    if pt.is_timestamp(t):
        if t.unit == "ns":
            raise ValueError(f"Illegal Parquet type: INT64 (TIMESTAMP(NANOS,{str(t.tz is not None).lower()})).")
        return T.TimestampType() if t.tz is not None else T.TimestampNTZType()
    if pt.is_list(t) or pt.is_large_list(t):
        return T.ArrayType(arrow_to_spark(t.value_type), True)
    if pt.is_map(t):
        return T.MapType(arrow_to_spark(t.key_type), arrow_to_spark(t.item_type), True)
    if pt.is_struct(t):
        return T.StructType([T.StructField(f.name, arrow_to_spark(f.type), True) for f in t])
    raise ValueError(f"Spark cannot read Arrow type {t}")


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow table's schema (what Spark would create the table from); a
    type no table column can have is refused naming the column."""
    from pyspark.sql import types as T

    fields = []
    for f in schema:
        try:
            fields.append(T.StructField(f.name, arrow_to_spark(f.type), True))
        except ValueError as exc:
            raise ValueError(f"column {f.name!r}: {exc}") from exc
    return T.StructType(fields)


def _spark_to_iceberg_type(t: DataType, next_id: Callable[[], int]):
    from pyiceberg import types as it
    from pyspark.sql import types as T

    simple = {T.StringType: it.StringType, T.LongType: it.LongType, T.IntegerType: it.IntegerType,
              T.ShortType: it.IntegerType, T.ByteType: it.IntegerType, T.DoubleType: it.DoubleType,
              T.FloatType: it.FloatType, T.BooleanType: it.BooleanType, T.DateType: it.DateType,
              T.TimestampType: it.TimestamptzType, T.TimestampNTZType: it.TimestampType, T.BinaryType: it.BinaryType}
    if type(t) in simple:
        return simple[type(t)]()
    if isinstance(t, T.DecimalType):
        return it.DecimalType(t.precision, t.scale)
    if isinstance(t, T.StructType):
        ids = [next_id() for _ in t.fields]  # a struct's own fields first, then what they nest
        return it.StructType(*[it.NestedField(i, f.name, _spark_to_iceberg_type(f.dataType, next_id), required=False)
                               for i, f in zip(ids, t.fields, strict=True)])
    if isinstance(t, T.ArrayType):
        eid = next_id()
        return it.ListType(eid, _spark_to_iceberg_type(t.elementType, next_id), element_required=False)
    if isinstance(t, T.MapType):
        kid, vid = next_id(), next_id()
        return it.MapType(kid, _spark_to_iceberg_type(t.keyType, next_id), vid,
                          _spark_to_iceberg_type(t.valueType, next_id), value_required=False)
    raise ValueError(f"no Iceberg type for Spark type {t.simpleString()}")


def spark_to_iceberg(schema: StructType):
    """The Iceberg schema Spark's Iceberg catalog creates for a frame of `schema` (all optional)."""
    from pyiceberg.schema import Schema

    counter = iter(range(1, 1 << 30))
    return Schema(*_spark_to_iceberg_type(schema, lambda: next(counter)).fields)


def iceberg_to_spark(t) -> DataType:
    """The Spark type Spark's Iceberg catalog reads an Iceberg type (or schema) as."""
    from pyiceberg import types as it
    from pyiceberg.schema import Schema
    from pyspark.sql import types as T

    if isinstance(t, (Schema, it.StructType)):
        return T.StructType([T.StructField(f.name, iceberg_to_spark(f.field_type), True) for f in t.fields])
    simple = {it.StringType: T.StringType, it.LongType: T.LongType, it.IntegerType: T.IntegerType,
              it.DoubleType: T.DoubleType, it.FloatType: T.FloatType, it.BooleanType: T.BooleanType,
              it.DateType: T.DateType, it.TimestamptzType: T.TimestampType, it.TimestampType: T.TimestampNTZType,
              it.BinaryType: T.BinaryType, it.UUIDType: T.StringType, it.FixedType: T.BinaryType}
    for k, v in simple.items():
        if isinstance(t, k):
            return v()
    if isinstance(t, it.DecimalType):
        return T.DecimalType(t.precision, t.scale)
    if isinstance(t, it.ListType):
        return T.ArrayType(iceberg_to_spark(t.element_type), True)
    if isinstance(t, it.MapType):
        return T.MapType(iceberg_to_spark(t.key_type), iceberg_to_spark(t.value_type), True)
    raise ValueError(f"no Spark type for Iceberg type {t}")


def _partition_spec(target: Target, schema):
    """The target's partition spec over `schema`, with Spark's partition field names."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import (
        BucketTransform,
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )

    make = {"identity": (IdentityTransform, ""), "bucket": (BucketTransform, "_bucket"),
            "truncate": (TruncateTransform, "_trunc"), "year": (YearTransform, "_year"),
            "month": (MonthTransform, "_month"), "day": (DayTransform, "_day"), "hour": (HourTransform, "_hour")}
    fields = []
    for i, p in enumerate(target.partition_spec):
        cls, suffix = make[p.transform]
        transform = cls(int(p.param)) if p.transform in ("bucket", "truncate") else cls()
        source = schema.find_field(p.column, case_sensitive=False)
        fields.append(PartitionField(source.field_id, 1000 + i, transform, source.name + suffix))
    return PartitionSpec(*fields)


# --------------------------------------------------------------------------- conforming Arrow data


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


def conform(table: pa.Table, want: StructType) -> pa.Table:
    """`table` as exactly `want`: columns matched by name case-insensitively, cast, NULL for what
    it lacks (the Arrow twin of lakehouse.ingest.prepare.conform)."""
    by_name = {n.lower(): n for n in table.column_names}
    cols, names = [], []
    for f in want.fields:
        at = spark_to_arrow(f.dataType)
        src = by_name.get(f.name.lower())
        cols.append(pa.nulls(table.num_rows, at) if src is None else _conform_array(table.column(src), at))
        names.append(f.name)
    return pa.table(cols, names=names)


def _field_path(table: pa.Table, path: str) -> pa.ChunkedArray:
    """A dotted path into struct columns, matched case-insensitively (Spark's `col("a.b")`)."""
    parts = path.split(".")
    by_name = {n.lower(): n for n in table.column_names}
    if parts[0].lower() not in by_name:
        raise ValueError(f"promote_fields: column {parts[0]!r} of path {path!r} is not in the data")
    arr = table.column(by_name[parts[0].lower()])
    for p in parts[1:]:
        names = {arr.type.field(i).name.lower(): arr.type.field(i).name for i in range(arr.type.num_fields)} \
            if pa.types.is_struct(arr.type) else {}
        if p.lower() not in names:
            raise ValueError(f"promote_fields: {path!r} has no field {p!r}")
        arr = pc.struct_field(arr, names[p.lower()])
    return arr


#: JSON-lines files from twice this size up are parsed in blocks of it, in parallel
READ_BLOCK_BYTES = 1 << 20


def _read_file(source: Source, path: str, own: StructType) -> pa.Table:
    """One file read with its own (probed) schema, the way Spark reads it with that schema."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq
    from pyspark.sql import types as T

    if source.format == "parquet":
        return pq.read_table(path)
    # timestamps and dates are read as text and parsed by `conform` with Spark's grammar
    types = {f.name: (pa.string() if isinstance(f.dataType, (T.TimestampType, T.TimestampNTZType, T.DateType))
                      else spark_to_arrow(f.dataType)) for f in own.fields}
    if source.format == "jsonl":
        data = Path(path).read_bytes()
        # from 2 MB up, blocks parse in parallel (half the time on two cores at 15 MB); with an explicit
        # schema the table is the one a single block gives. A block is at least twice the longest
        # line, as the probe's: a line straddling more than one block boundary is refused by
        # pyarrow, and that refusal can abort the process as its threads unwind (pyarrow 21)
        block = len(data) + 1 if len(data) < 2 * READ_BLOCK_BYTES else max(READ_BLOCK_BYTES, 2 * longest_line(data) + 2)
        return pjson.read_json(pa.BufferReader(data), read_options=pjson.ReadOptions(block_size=block),
                               parse_options=pjson.ParseOptions(explicit_schema=pa.schema(types.items()),
                                                                unexpected_field_behavior="ignore"))
    # CSV: the names in file order (the probe's header), RFC 4180 quotes, quoted newlines, "" is NULL
    return pcsv.read_csv(
        path, read_options=pcsv.ReadOptions(column_names=own.names, skip_rows=1 if source.csv_header else 0),
        parse_options=pcsv.ParseOptions(newlines_in_values=source.options.get("csv_multiline", "true") == "true"),
        convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True, null_values=[""],
                                            quoted_strings_can_be_null=False))


def read_prepared(prepared: PreparedFiles, files: list[FileRef], object_uri: Callable[[FileRef], str] | None
                  ) -> pa.Table:
    """The loadable `files` as one Arrow table in the reconciled schema, with the promoted fields
    and the lineage columns (what `PreparedFiles.read` + `read_batch` give on Spark)."""
    source = prepared.source
    parts = []
    for f in files:
        local = f.local_path or f.key
        try:
            t = conform(_read_file(source, local, prepared.read_schemas[f.key]), prepared.schema)
        except (pa.ArrowException, ValueError) as exc:  # what the probe passed and pyarrow still refuses
            raise ValueError(f"{f.key}: the Arrow engine cannot read this file as its probe planned ({exc}); "
                             "set the target's engine to spark to load it") from exc
        if source.lineage_columns:
            name = object_uri(f) if object_uri is not None and f.local_path and f.local_path != f.key \
                else Path(local).resolve().as_uri()
            t = t.append_column("_source_file", pa.repeat(pa.scalar(name, pa.string()), t.num_rows))
        parts.append(t)
    out = pa.concat_tables(parts)
    if source.lineage_columns:  # promoted fields come before the lineage columns, as on Spark
        src_file = out.column("_source_file")
        out = out.drop_columns(["_source_file"])
    for pf in source.promote_fields:
        out = out.append_column(pf.column, _field_path(out, pf.path))
    if source.lineage_columns:
        now = pa.scalar(dt.datetime.now(dt.UTC), UTC_US)
        out = out.append_column("_source_file", src_file)
        out = out.append_column("_ingested_at", pa.repeat(now, out.num_rows))
    return out


# --------------------------------------------------------------------------- PyIceberg tables


class ArrowTables(IcebergTables):
    """The platform's tables with writes and branch operations through PyIceberg: nothing here
    starts a JVM (metadata reads were PyIceberg's already). Spark stays reachable, lazily, for the
    rare shared paths that need it (an orphan-file sweep)."""

    def __init__(self, platform: Platform):
        super().__init__(platform.spark, platform.settings.catalog_name, platform.pyiceberg_catalog())

    def ensure_namespace(self, ns: str) -> None:
        try:
            self.meta.create_namespace_if_not_exists(ns)
        except Exception:  # the SQL catalog's insert lost to another run's (an IntegrityError, not AlreadyExists)
            if not self.meta.namespace_exists(ns):
                raise

    def ensure_table(self, target: Target, schema: StructType, *, wap: bool = True) -> bool:
        """Create the table as Spark's catalog would from `schema` (same columns, types, partition
        spec and properties). True if created."""
        ident = target.identifier
        self.ensure_namespace(target.namespace)
        if self.exists(ident):
            return False
        if target.sort_order:
            raise ValueError(f"{ident}: a sort order is set on write by Spark; the Arrow engine does not sort")
        ice = spark_to_iceberg(schema)
        props = {"format-version": "2", "write.wap.enabled": "true" if wap else "false", **target.table_properties}
        try:
            self.meta.create_table(ident, schema=ice, partition_spec=_partition_spec(target, ice), properties=props)
        except Exception:
            if self.exists(ident):
                return False  # another run created it at the same moment
            raise
        log.info("created Iceberg table %s (PyIceberg)", ident)
        return True

    def add_missing_columns(self, identifier: str, schema: StructType) -> list[str]:
        table = self.meta.load_table(identifier)
        existing = {f.name.lower() for f in table.schema().fields}
        new = [f for f in schema.fields if f.name.lower() not in existing]
        if new:
            with table.update_schema() as upd:
                for f in new:
                    upd.add_column(f.name, _spark_to_iceberg_type(f.dataType, iter(range(1, 1 << 30)).__next__))
        return [f.name for f in new]

    def create_branch(self, identifier: str, branch: str) -> None:
        """Branch from main's current snapshot; an empty table first gets an empty main snapshot."""
        table = self.meta.load_table(identifier)
        if branch in table.metadata.refs:
            return
        if table.metadata.current_snapshot_id is None:
            table.append(table.schema().as_arrow().empty_table())  # an empty snapshot to branch from
        table.manage_snapshots().create_branch(table.metadata.current_snapshot_id, branch).commit()

    def drop_branch(self, identifier: str, branch: str) -> None:
        if branch == MAIN:
            raise ValueError("refusing to drop the main branch")
        table = self.meta.load_table(identifier)
        if branch in table.metadata.refs:
            table.manage_snapshots().remove_branch(branch).commit()

    def expire_snapshots(self, identifier: str, snapshot_ids: list[int]) -> None:
        """Metadata only: the files of those snapshots wait for the orphan-file sweep."""
        self.meta.load_table(identifier).maintenance.expire_snapshots().by_ids(list(snapshot_ids)).commit()

    def refresh_table(self, identifier: str) -> None:
        """PyIceberg loads the table afresh on every call: nothing is cached to refresh."""

    def write(self, df: pa.Table, target: Target, *, branch: str = MAIN, snapshot_properties: dict[str, str] | None = None,
              mode: str | None = None, spec=None) -> WriteResult:
        """Append `df` to `branch`, or replace the branch's rows with it (`overwrite` of the whole
        table: a DuckDB SQL stage's full recompute), its columns matched to the table's by name."""
        mode = spec.mode if spec is not None else (mode or target.write_mode)
        if mode not in ("append", "overwrite") or (spec is not None and spec.condition is not None):
            raise ValueError(f"{target.identifier}: the Arrow engine appends or replaces the whole table, "
                             f"not {mode!r}" + (" of some rows" if mode == "overwrite" else ""))
        ident = target.identifier
        table = self.meta.load_table(ident)
        before = table.metadata.refs[branch].snapshot_id if branch in table.metadata.refs else None
        rows, props = _to_table(df, table.schema()), dict(snapshot_properties or {})
        with table.transaction() as tx:
            if mode == "append":
                tx.append(rows, snapshot_properties=props, branch=branch)
            else:
                import warnings

                with warnings.catch_warnings():  # replacing an empty branch: nothing to delete is no news
                    warnings.filterwarnings("ignore", "Delete operation did not match any records")
                    tx.overwrite(rows, snapshot_properties=props, branch=branch)
        after = self.snapshot_id(ident, branch)
        summary = self.snapshot_summary(ident, after) if after is not None and after != before else {}
        return WriteResult(ident, branch, after, int(summary.get("added-records", 0)), mode, summary)


def _to_table(df: pa.Table, schema) -> pa.Table:
    """`df` in the table's column order and Arrow types (NULL for table columns it lacks)."""
    want = schema.as_arrow()
    by_name = {n.lower(): n for n in df.column_names}
    extra = [n for n in df.column_names if n.lower() not in {f.name.lower() for f in want}]
    if extra:
        raise ValueError(f"column(s) {extra} are not in the table (its columns: {[f.name for f in want]})")
    cols = [pa.nulls(df.num_rows, f.type) if f.name.lower() not in by_name
            else _conform_array(df.column(by_name[f.name.lower()]), f.type) for f in want]
    return pa.table(cols, schema=want)


class ArrowSchemaIO:
    """`prepare_files`' questions answered by PyIceberg and pyarrow (see SparkSchemaIO)."""

    def __init__(self, tables: ArrowTables):
        self.tables = tables

    def exists(self, ident: str) -> bool:
        return self.tables.exists(ident)

    def table_schema(self, ident: str) -> StructType:
        return iceberg_to_spark(self.tables.meta.load_table(ident).schema())

    def footer_schema(self, path: str) -> StructType:
        import pyarrow.parquet as pq

        return arrow_to_spark(pa.struct(list(pq.read_schema(path))))

    def evolve(self, ident: str, changes: list) -> None:
        """New columns (nested too) and promotable widenings in one schema commit."""
        def apply() -> None:
            table = self.tables.meta.load_table(ident)
            current = iceberg_to_spark(table.schema())
            from lakehouse.ingest.prepare import _has_path

            with table.update_schema() as upd:
                for c in changes:
                    if c.kind == "new" and _has_path(current, c.path):
                        continue  # a concurrent run or a healing retry added it already
                    ice = _spark_to_iceberg_type(c.found, iter(range(1, 1 << 30)).__next__)
                    if c.kind == "new":
                        upd.add_column(tuple(c.path), ice)
                    else:
                        upd.update_column(tuple(c.path), ice)

        retry_metadata_commit(self.tables, ident, apply)


# --------------------------------------------------------------------------- rules on Arrow


def _column(table: pa.Table, rule: Rule, name: str) -> pa.ChunkedArray:
    by_name = {n.lower(): n for n in table.column_names}
    if name.lower() not in by_name:
        raise RuleError(f"rule {rule.name!r}: column(s) {[name]} not in the dataset (columns: "
                        f"{sorted(table.column_names)})")
    return table.column(by_name[name.lower()])


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
            cond = pc.and_kleene(cond, pc.greater_equal(col, _literal(rule.min, col.type)))
        if rule.max is not None:
            cond = pc.and_kleene(cond, pc.less_equal(col, _literal(rule.max, col.type)))
    elif rule.type == "regex":
        cond = pc.match_substring_regex(col.cast(pa.string()), rule.pattern or "")
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
    from lakehouse.sqlparse import DuckdbSqlError, expression_to_duckdb
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
    return [outcomes[r.name] for r in enabled]


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


# --------------------------------------------------------------------------- the audited write


class ArrowQuarantineWriter(QuarantineWriter):
    """Quarantined rows to the quarantine table's branch through PyIceberg (same columns as Spark's)."""

    def write(self, bad: pa.Table, batch_properties: dict[str, str] | None = None) -> int:
        n = bad.num_rows
        rows = (bad.append_column("_run_id", pa.array([self.runner.run_id] * n, pa.string()))
                .append_column("_quarantined_at", pa.array([dt.datetime.now(dt.UTC)] * n, UTC_US))
                .append_column("_quarantine_id", pa.array([str(uuid.uuid4()) for _ in range(n)], pa.string())))
        return self.append(rows, spark_schema(rows.schema), batch_properties)

    def align(self, rows: pa.Table) -> pa.Table:
        return rows  # ArrowTables.write matches the table's columns by name


class ArrowAuditedWrite(AuditedWrite):
    """`AuditedWrite` with Arrow batches: the split, the branch writes and the audit on Arrow;
    the branch bookkeeping and the exactly-once publish are the base class's (PyIceberg already)."""

    def write(self, batch: Batch) -> WriteResult:
        from lakehouse import retry
        from lakehouse.outage import is_connection_failure

        df: pa.Table = batch.df
        keep = self._split(df, batch)
        if not self.created:
            self._start_branch(spark_schema(keep.schema))
        head = self.tables.snapshot_id(self.ident, self.branch)
        res = retry.call(retry.BRANCH_WRITE,
                         lambda: self.tables.write(keep, self.target, branch=self.branch,
                                                   snapshot_properties=batch.snapshot_properties, spec=batch.write),
                         what=f"write to {self.ident}@{self.branch}", also=is_connection_failure,
                         only=lambda _exc: self.tables.snapshot_id(self.ident, self.branch) == head)
        if res.operation != "append":  # the branch's rows are all new: the audit reads the whole branch
            self.appends_only = False
        return res

    def _split(self, df: pa.Table, batch: Batch) -> pa.Table:
        """Drop / quarantine rows by the acting rules (a row failing both is quarantined); count them."""
        acting = acting_rules(self.rules)
        if not acting or self.actions is None:
            return df
        fails = tag_failures(df, self.rules, self.actions.errors, self._time_zone())
        acting = [r for r in acting if r.name in fails]
        if not acting:
            return df
        self.actions.total += df.num_rows
        for r in acting:
            n = pc.sum(fails[r.name].cast(pa.int64())).as_py() or 0
            self.actions.failed[r.name] = self.actions.failed.get(r.name, 0) + n
            if n and len(self.actions.samples.get(r.name, [])) < SAMPLE_ROWS:
                self.actions.samples.setdefault(r.name, []).extend(_sample(df, fails[r.name]))
        any_acting = _any([fails[r.name] for r in acting], df.num_rows)
        q_names = [r.name for r in acting if r.action == "quarantine"]
        if q_names and self.quarantine_enabled:
            bad_mask = _any([fails[n] for n in q_names], df.num_rows)
            if pc.any(bad_mask).as_py():
                names = list(fails)
                flags = [fails[n].filter(bad_mask).to_pylist() for n in names]  # the quarantined rows only
                failed_rules = pa.array([[n for n, f in zip(names, row, strict=True) if f] for row in zip(*flags, strict=True)],
                                        pa.list_(pa.string()))
                bad = df.filter(bad_mask).append_column(FAILED_RULES_COLUMN, failed_rules)
                self.quarantined_rows += self._quarantine_writer().write(bad, batch.snapshot_properties)
        return df.filter(pc.invert(any_acting))

    def _time_zone(self) -> str:
        """Spark's session time zone as the platform configures it: an expression over timestamps
        gives the same answer on both engines."""
        return self.runner.platform.settings.session_time_zone

    def _quarantine_writer(self):
        if self._quarantine is None:
            self._quarantine = ArrowQuarantineWriter(self.runner, self.tables, self.branch)
        return self._quarantine

    def _new_rows(self) -> pa.Table:
        """The rows this run added on its branch: its own data files (or the whole branch when a
        write replaced data), read by PyIceberg."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        head = self.tables.snapshot_id(self.ident, self.branch)
        table = self.tables.meta.load_table(self.ident)
        if head is None or (self.appends_only and head == self.fork_snapshot):
            return table.schema().as_arrow().empty_table()
        found = self.tables.data_files(self.ident, head, self.fork_snapshot if self.appends_only else None)
        tasks = list(table.scan(snapshot_id=head).plan_files())
        if found is not None:
            mine = {f.file_path for f in found[1]}
            tasks = [t for t in tasks if t.file.file_path in mine]
        return ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)

    def audit(self) -> list[CheckOutcome]:
        head = self.tables.snapshot_id(self.ident, self.branch)
        context: dict[str, Any] = {"previous_row_count": self.previous_rows,
                                   "row_count_after": self._total_records(self.branch),
                                   "row_actions": self.actions, "time_zone": self._time_zone()}
        keys = sorted({c for r in self.rules if r.type == "unique" for c in r.columns})
        if keys:
            table = self.tables.meta.load_table(self.ident)
            names = {f.name.lower(): f.name for f in table.schema().fields}
            context["table"] = table.scan(snapshot_id=head, selected_fields=tuple(names.get(k.lower(), k) for k in keys)
                                          ).to_arrow()
        return evaluate(self._new_rows(), self.rules, context)


def _any(masks: list, n: int):
    out = None
    for m in masks:
        out = m if out is None else pc.or_(out, m)
    return out if out is not None else pa.array([False] * n)


# --------------------------------------------------------------------------- the engine


def file_batches(ctx: StageContext, plan: ExtractPlan, tables: ArrowTables) -> Iterator[Batch]:
    """The planned files probed and reconciled on their own (the shared prepare step), then read by
    pyarrow in batches of `batch_files`, one checkpointed commit per batch (FileSourceAdapter.batches)."""
    from lakehouse.core import Batch

    src = ctx.source
    object_uri = ctx.adapter().object_uri(ctx)
    todo = [f for f in plan.files if f.key not in ctx.healing.quarantined_files]
    done = 0
    prepared = prepare_files(ctx, None, src, todo, schema_io=ArrowSchemaIO(tables))
    for chunk in file_ingest.batches(prepared.files, ctx.healing.effective_batch(src.batch_files),
                                      ctx.healing.effective_batch(src.batch_bytes)):
        checked, good = checked_files(ctx, chunk)
        done += len(chunk)
        props = {file_ingest.CHECKPOINT_PROPERTY: file_ingest.checkpoint_value(checked),
                 "lakehouse.run_id": ctx.run_id}
        if good:
            yield Batch(read_prepared(prepared, good, object_uri), props, good,
                        label=f"{len(good)} files, {done}/{len(todo)} files done")


class ArrowEngine:
    """PyIceberg + Arrow: no JVM (lakehouse.engine chooses it)."""

    name = "arrow"

    def tables(self, platform: Platform) -> ArrowTables:
        return ArrowTables(platform)

    def session(self, ctx: StageContext, tables: IcebergTables, branch: str, **kwargs: Any) -> ArrowAuditedWrite:
        return ArrowAuditedWrite(ctx, tables, branch, **kwargs)

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        if plan.kind == SQL:  # a DuckDB SQL stage (lakehouse.engine chose Arrow for it)
            from lakehouse.sources.sql import duckdb_arrow_batches

            return duckdb_arrow_batches(ctx, plan)
        return file_batches(ctx, plan, self.tables(ctx.platform))

