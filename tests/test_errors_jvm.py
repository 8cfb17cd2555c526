"""The JVM error mapper against real Iceberg exceptions raised through Spark and Py4J.

Two real failures: a table metadata commit on a stale base (Iceberg's CommitFailedException, what a
concurrent writer causes) and an overwrite validated against a table that moved since it was
planned (Iceberg's ValidationException). The first is transient (repeat against the table as it
is now: the retry helper does, exactly its policy's attempts); the second is not (the same commit
fails the same way; a fresh plan, i.e. healing or a step retry, may pass).
"""

from __future__ import annotations

import pytest

from lakehouse import errors
from lakehouse.runtime import retry
from lakehouse.table.iceberg import quote

pytestmark = pytest.mark.slow


@pytest.fixture
def table(platform, unique_ns):
    tables = platform.tables()
    ident = f"{unique_ns}.errs"
    tables.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(platform.settings.catalog_name)}.{quote(unique_ns)}")
    tables.spark.sql(f"CREATE TABLE {tables.qualified(ident)} (id bigint) USING iceberg")
    tables.spark.sql(f"INSERT INTO {tables.qualified(ident)} VALUES (1)")
    return tables, ident


def test_a_stale_commit_is_a_transient_commit_conflict(table):
    tables, ident = table
    jvm = tables.spark.sparkContext._jvm
    ops = tables.java_table(ident).operations()
    base = ops.current()

    def commit_on(stale_base, key):
        props = jvm.java.util.HashMap()
        props.put(key, "1")
        ops.commit(stale_base, stale_base.replaceProperties(props))

    commit_on(base, "first")  # another writer moves the table
    with pytest.raises(Exception) as raised:
        commit_on(base, "second")
    info = errors.classify(raised.value)
    assert info.error_class == "org.apache.iceberg.exceptions.CommitFailedException"
    assert (info.code, info.kind) == (errors.ICEBERG_COMMIT_CONFLICT, errors.TRANSIENT)

    calls = []

    def stale_again():
        calls.append(1)
        commit_on(base, f"again{len(calls)}")

    with pytest.raises(Exception) as raised_again:
        retry.call(retry.METADATA_COMMIT, stale_again, what="stale commit", sleep=lambda _s: None)
    assert errors.classify(raised_again.value).code == errors.ICEBERG_COMMIT_CONFLICT
    assert len(calls) == retry.METADATA_COMMIT.attempts


def test_an_overwrite_validated_against_a_moved_table_is_a_validation_error_not_repeated(table):
    tables, ident = table
    jvm = tables.spark.sparkContext._jvm
    t = tables.java_table(ident)
    planned_on = t.currentSnapshot().snapshotId()
    tables.spark.sql(f"INSERT INTO {tables.qualified(ident)} VALUES (2)")  # a concurrent append
    t.refresh()
    everything = jvm.org.apache.iceberg.expressions.Expressions.alwaysTrue()
    calls = []

    def overwrite():  # what a serializable overwrite planned on `planned_on` commits
        calls.append(1)
        (t.newOverwrite().overwriteByRowFilter(everything).validateFromSnapshot(planned_on)
         .conflictDetectionFilter(everything).validateNoConflictingData().commit())

    with pytest.raises(Exception) as raised:
        retry.call(retry.METADATA_COMMIT, overwrite, what="overwrite", sleep=lambda _s: None)
    info = errors.classify(raised.value)
    assert info.error_class == "org.apache.iceberg.exceptions.ValidationException"
    assert (info.code, info.kind) == (errors.ICEBERG_VALIDATION, errors.RECOVERABLE)
    assert len(calls) == 1


def test_pyspark_captured_exceptions_are_read_through_their_java_origin(table):
    """A fast-forward of main to a branch it is not an ancestor of: Iceberg's precondition, which
    PySpark hands over as its own IllegalArgumentException with the Java one on `_origin`."""
    tables, ident = table
    spark, name = tables.spark, tables.qualified(ident)
    spark.sql(f"ALTER TABLE {name} CREATE BRANCH side")
    spark.sql(f"INSERT INTO {name} VALUES (2)")  # main moves on
    spark.sql(f"INSERT INTO {tables.qualified(ident, 'side')} VALUES (3)")  # and so does the branch
    with pytest.raises(Exception) as raised:
        spark.sql(f"CALL {quote(tables.catalog)}.system.fast_forward(table => '{ident}', branch => 'main', "
                  "to => 'side')").collect()
    assert type(raised.value).__module__.startswith("pyspark.errors")
    info = errors.classify(raised.value)
    assert info.error_class == "java.lang.IllegalArgumentException"
    assert "java.lang.RuntimeException" in info.class_names  # superclasses come from the JVM
    assert not info.transient
