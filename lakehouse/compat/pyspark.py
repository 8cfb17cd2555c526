"""PySpark's Py4J bridge, the one place the platform reaches it.

PySpark has no public accessor for the JVM behind a session, nor for the Java objects behind a
DataFrame or a Column; the platform needs them for what neither Spark SQL nor the DataFrame API
offers: Iceberg's Java API (a table's operations, `CommitMetadata` for snapshot properties of SQL
writes, a branch on an empty table in one commit), a JDBC probe through the driver's own
`DriverManager`, whether an analysed expression is deterministic, and a Column rendered as SQL text.
Every such access goes through the functions here (tests/test_no_private_api.py forbids them
elsewhere); tests/test_compat_pyspark.py fails on a PySpark outside `WRITTEN_FOR`.
"""

from __future__ import annotations

from typing import Any

#: the PySpark releases this module was written for and tested with (pyproject pins the same)
WRITTEN_FOR = {"pyspark": ">=3.5.5,<3.6"}


def jvm(spark) -> Any:
    """The Py4J view of the session's JVM (`jvm.java.util.HashMap()`, `jvm.org.apache.iceberg...`)."""
    return spark.sparkContext._jvm


def java_session(spark) -> Any:
    """The session's `org.apache.spark.sql.SparkSession`, made the active one of the calling thread
    first (`make_active`): what the caller does with it next may look a catalog up."""
    make_active(spark)
    return spark._jsparkSession


def make_active(spark) -> None:
    """Make `spark` the active session of the JVM thread that serves the calling Python thread
    (PySpark pins one JVM thread to each Python thread), with Spark's public
    `SparkSession.setActiveSession`.

    Why: Spark resolves a catalog's configuration through the *thread's* active session
    (`SQLConf.get`). Spark SQL statements set it for their own duration, but a Java call through
    Py4J (Iceberg's `Spark3Util`, its actions, `DataFrameReader.load` of an `iceberg` table) does
    not; on a thread where no session is active it reads a blank configuration, in which no
    catalog is defined. That goes unnoticed while the catalog is already loaded (Spark caches
    it), and fails with `CatalogNotFoundException: ... spark.sql.catalog.<name> is not defined`
    when the catalog has to be (re)loaded on such a thread: the session was started on another
    thread (`lakehouse run` warms it up on one) and its first load failed because the catalog
    database was down, or a restarted session replaced the one the thread knew."""
    jvm(spark).org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def is_stopped(spark) -> bool:
    """Whether the session's SparkContext has been stopped (PySpark 3.5 clears its Java context)."""
    return spark is None or spark.sparkContext._jsc is None


def context_active() -> bool:
    """Whether this process has a running SparkContext (without starting one)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


def analyzed_deterministic(frame) -> bool:
    """Whether the frame's first analysed expression is deterministic."""
    return bool(frame._jdf.queryExecution().analyzed().expressions().head().deterministic())


def column_sql(column) -> str:
    """A Column as Spark SQL text, rendered by Spark (every value a typed, escaped literal)."""
    return str(column._jc.expr().sql())


def parse_type(text: str):
    """A Spark SQL DDL type (`decimal(10,2)`, `array<struct<a:int>>`) parsed by Spark's own parser;
    needs a running SparkContext (PySpark 3.5 has no public DDL parser: `DataType.fromDDL` is 4.0)."""
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(text)
