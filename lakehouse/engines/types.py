"""The platform's type model: Arrow schemas, and the Iceberg schemas of the tables, mapped to each
other the way Spark's Iceberg integration maps them, so a table either engine creates is the same
table (same types, same field ids).

Spark's `pyspark.sql.types` meet this model only at its edges, and only here: the Spark engine and
the shared probe and reconciliation of files (lakehouse.ingest.prepare, which still speaks Spark
types) convert with `spark_to_arrow` / `arrow_to_spark` / `spark_to_iceberg` / `iceberg_to_spark`,
pure Python (no JVM), imported lazily. The Arrow engine (lakehouse.engines.arrow) imports no
pyspark module itself: it works in Arrow and Iceberg schemas (`arrow_to_iceberg`) and asks this
module to translate what the shared reconciliation hands it (`arrow_schema`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

UTC_US = pa.timestamp("us", tz="UTC")



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


# --------------------------------------------------------------------------- Arrow <-> Iceberg (no Spark)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema a Spark schema (the shared reconciliation's) is read and written as."""
    return pa.schema([pa.field(f.name, spark_to_arrow(f.dataType)) for f in schema.fields])


def _arrow_to_iceberg_type(t: pa.DataType, next_id: Callable[[], int]):
    """The Iceberg type Spark's catalog gives a column Spark reads as Arrow type `t` (what
    `spark_to_iceberg(spark_schema(...))` gives, without Spark's types): small and unsigned integers
    widen as Spark reads them, nanosecond timestamps are refused as Spark refuses them."""
    from pyiceberg import types as it

    pt = pa.types
    if pt.is_dictionary(t):
        return _arrow_to_iceberg_type(t.value_type, next_id)
    for test, out in ((pt.is_boolean, it.BooleanType), (pt.is_int8, it.IntegerType), (pt.is_int16, it.IntegerType),
                      (pt.is_int32, it.IntegerType), (pt.is_uint8, it.IntegerType), (pt.is_uint16, it.IntegerType),
                      (pt.is_int64, it.LongType), (pt.is_uint32, it.LongType), (pt.is_float32, it.FloatType),
                      (pt.is_float64, it.DoubleType), (pt.is_date, it.DateType)):
        if test(t):
            return out()
    if pt.is_uint64(t):
        return it.DecimalType(20, 0)
    if pt.is_decimal(t):
        return it.DecimalType(t.precision, t.scale)
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_string_view(t):
        return it.StringType()
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t):
        return it.BinaryType()
    if pt.is_timestamp(t):
        if t.unit == "ns":
            raise ValueError(f"Illegal Parquet type: INT64 (TIMESTAMP(NANOS,{str(t.tz is not None).lower()})).")
        return it.TimestamptzType() if t.tz is not None else it.TimestampType()
    if pt.is_struct(t):
        ids = [next_id() for _ in range(t.num_fields)]  # a struct's own fields first, then what they nest
        return it.StructType(*[it.NestedField(i, f.name, _arrow_to_iceberg_type(f.type, next_id), required=False)
                               for i, f in zip(ids, t, strict=True)])
    if pt.is_list(t) or pt.is_large_list(t):
        eid = next_id()
        return it.ListType(eid, _arrow_to_iceberg_type(t.value_type, next_id), element_required=False)
    if pt.is_map(t):
        kid, vid = next_id(), next_id()
        return it.MapType(kid, _arrow_to_iceberg_type(t.key_type, next_id), vid,
                          _arrow_to_iceberg_type(t.item_type, next_id), value_required=False)
    raise ValueError(f"no Iceberg type for Arrow type {t}")


def arrow_type_to_iceberg(t: pa.DataType):
    """`t` as an Iceberg type (ids to be reassigned by the schema update that adds it)."""
    return _arrow_to_iceberg_type(t, iter(range(1, 1 << 30)).__next__)


def arrow_to_iceberg(schema: pa.Schema):
    """The Iceberg schema Spark's Iceberg catalog creates for a frame of Arrow schema `schema` (all
    optional, Spark's field ids); a type no table column can have is refused naming the column."""
    from pyiceberg.schema import Schema

    counter = iter(range(1, 1 << 30))
    next_id = counter.__next__
    ids = [next_id() for _ in schema]
    fields = []
    from pyiceberg.types import NestedField

    for i, f in zip(ids, schema, strict=True):
        try:
            fields.append(NestedField(i, f.name, _arrow_to_iceberg_type(f.type, next_id), required=False))
        except ValueError as exc:
            raise ValueError(f"column {f.name!r}: {exc}") from exc
    return Schema(*fields)


def spark_type_to_iceberg(t: DataType):
    """A Spark type (the shared reconciliation's) as an Iceberg type, ids to be reassigned."""
    return _spark_to_iceberg_type(t, iter(range(1, 1 << 30)).__next__)
