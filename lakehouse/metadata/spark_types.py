"""Spark SQL DDL column types (`bigint`, `decimal(10,2)`, `array<struct<a:int>>`), parsed in plain Python.

One grammar for the run and for validation: the ingestion of declared columns builds its Spark
types with it (lakehouse.ingest.prepare; Spark's own parser, which needs a JVM, answers what this
grammar lacks when a session is up), and `metadata validate` refuses a declared type neither can
read (`type_problem`), so a type such as ``string) ; DROP ...`` never reaches a run.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

_SIMPLE_TYPES = {"string": "StringType", "varchar": "StringType", "char": "StringType", "bigint": "LongType",
                 "long": "LongType", "int": "IntegerType", "integer": "IntegerType", "smallint": "ShortType",
                 "short": "ShortType", "tinyint": "ByteType", "byte": "ByteType", "double": "DoubleType",
                 "float": "FloatType", "real": "FloatType", "boolean": "BooleanType", "bool": "BooleanType",
                 "date": "DateType", "timestamp": "TimestampType", "timestamp_ltz": "TimestampType",
                 "timestamp_ntz": "TimestampNTZType", "binary": "BinaryType"}
_TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


def parse_ddl_type(text: str) -> DataType:
    """A column type in Spark SQL DDL parsed in plain Python (no JVM), or ValueError naming it."""
    from pyspark.sql import types as T

    tokens = _TOKEN.findall(text)
    if _TOKEN.sub("", text).strip():  # characters no token covers
        raise ValueError(f"cannot parse type {text!r}")
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens) or (expected is not None and tokens[pos].lower() != expected):
            raise ValueError(f"cannot parse type {text!r}: expected {expected or 'more'} at token {pos + 1}")
        pos += 1
        return tokens[pos - 1]

    def name() -> str:
        tok = take()
        return tok[1:-1].replace("``", "`") if tok.startswith("`") else tok

    def one() -> DataType:
        word = take().lower()
        if word in _SIMPLE_TYPES:
            if word in ("varchar", "char") and pos < len(tokens) and tokens[pos] == "(":
                take("("), take(), take(")")
            return getattr(T, _SIMPLE_TYPES[word])()
        if word in ("decimal", "dec", "numeric"):
            if pos < len(tokens) and tokens[pos] == "(":
                take("(")
                p = int(take())
                s = 0
                if tokens[pos] == ",":
                    take(",")
                    s = int(take())
                take(")")
                return T.DecimalType(p, s)
            return T.DecimalType(10, 0)
        if word == "array":
            take("<")
            elem = one()
            take(">")
            return T.ArrayType(elem, True)
        if word == "map":
            take("<")
            k = one()
            take(",")
            v = one()
            take(">")
            return T.MapType(k, v, True)
        if word == "struct":
            take("<")
            fields = []
            while tokens[pos] != ">":
                n = name()
                take(":")
                fields.append(T.StructField(n, one(), True))
                if tokens[pos] == ",":
                    take(",")
            take(">")
            return T.StructType(fields)
        raise ValueError(f"cannot parse type {text!r}: unknown type {word!r}")

    try:
        out = one()
    except IndexError:
        raise ValueError(f"cannot parse type {text!r}: it ends too early") from None
    if pos != len(tokens):
        raise ValueError(f"cannot parse type {text!r}: unexpected {tokens[pos]!r}")
    return out


def type_problem(text: str) -> str | None:
    """Why `text` is not one Spark SQL column type, or None. This grammar first; what it lacks (an
    interval, `struct<a int>`) passes when it is written in the grammar's tokens only (no quote,
    comment or semicolon) and sqlglot reads it as exactly the type of one CAST, Spark's parser
    deciding at run time."""
    try:
        parse_ddl_type(text)
        return None
    except ValueError as exc:
        problem = str(exc)
    if _TOKEN.sub("", text).strip():
        return problem
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        trees = [t for t in sqlglot.parse(f"SELECT CAST(NULL AS {text})", read="spark") if t is not None]
    except SqlglotError:
        return problem
    if len(trees) == 1 and isinstance(trees[0], exp.Select) and len(trees[0].expressions) == 1 \
            and isinstance(trees[0].expressions[0], exp.Cast):
        return None
    return problem
