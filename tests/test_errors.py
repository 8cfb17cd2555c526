"""The one error hierarchy, the JVM mapper and the one retry helper, without a JVM.

The mapper reads Java classes (and their superclasses and causes) the way it reads them from a
real Py4J gateway, here from Py4J-shaped stand-ins (tests/fixtures/py4j_like.py); the real thing
is in tests/test_errors_jvm.py. The retry helper is checked to give exactly its policy's calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lakehouse import errors
from lakehouse.errors import classify, source_unreachable
from lakehouse.runtime import retry
from tests.fixtures.py4j_like import JavaThrowable, java_error

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("exc", "code", "kind"), [
    (java_error("org.apache.iceberg.exceptions.CommitFailedException", message="Cannot commit"),
     errors.ICEBERG_COMMIT_CONFLICT, errors.TRANSIENT),
    (java_error("org.apache.iceberg.exceptions.CommitStateUnknownException"), errors.ICEBERG_COMMIT_CONFLICT,
     errors.TRANSIENT),
    # a subclass is found through its superclass, whatever it is called
    (java_error("com.example.MyCommitFailed", superclass="org.apache.iceberg.exceptions.CommitFailedException"),
     errors.ICEBERG_COMMIT_CONFLICT, errors.TRANSIENT),
    (java_error("org.apache.iceberg.exceptions.ValidationException", message="Cannot fast-forward"),
     errors.ICEBERG_VALIDATION, errors.RECOVERABLE),
    (java_error("org.apache.iceberg.jdbc.UncheckedSQLException", "org.sqlite.SQLiteException",
                result_code="SQLITE_BUSY_SNAPSHOT"), errors.DATABASE_BUSY, errors.TRANSIENT),
    (java_error("org.apache.iceberg.jdbc.UncheckedSQLException", "org.postgresql.util.PSQLException",
                sql_state="40001"), errors.DATABASE_BUSY, errors.TRANSIENT),
    (java_error("org.postgresql.util.PSQLException", "java.net.ConnectException", sql_state="08001"),
     errors.SOURCE_UNAVAILABLE, errors.TRANSIENT),
    (java_error("org.apache.spark.SparkException", "java.lang.OutOfMemoryError"), errors.OUT_OF_MEMORY,
     errors.RECOVERABLE),
    (java_error("org.apache.spark.SparkException", "org.apache.parquet.io.ParquetDecodingException"),
     errors.CORRUPT_INPUT, errors.RECOVERABLE),
])
def test_the_jvm_mapper_classifies_by_java_class_and_cause(exc, code, kind):
    info = classify(exc)
    assert (info.code, info.kind) == (code, kind)


def test_message_words_alone_classify_nothing():
    """What used to be sniffed ("stale", "conflict", a class name in the text) is not a class."""
    exc = java_error("java.lang.RuntimeException", message="stale conflict: CommitFailedException in a message")
    info = classify(exc)
    assert info.code == errors.UNKNOWN and info.kind == errors.RECOVERABLE
    assert "CommitFailedException" not in info.class_names


def test_captured_pyspark_exceptions_are_read_through_their_origin():
    class AnalysisException(Exception):  # pyspark's captured exceptions keep the Java one on `_origin`
        def __init__(self, origin):
            super().__init__("[X] something")
            self._origin = origin

    info = classify(AnalysisException(JavaThrowable("org.apache.iceberg.exceptions.CommitFailedException")))
    assert info.code == errors.ICEBERG_COMMIT_CONFLICT
    assert info.error_class == "org.apache.iceberg.exceptions.CommitFailedException"


def test_a_dead_gateway_falls_back_to_the_python_class():
    class DeadThrowable:
        def getClass(self):
            raise ConnectionError("Answer from Java side is empty")

    class Py4JError(Exception):
        java_exception = DeadThrowable()

    assert errors.java_classes(Py4JError("x")) == []
    assert classify(Py4JError("x")).code == errors.UNKNOWN


def test_raise_sites_declare_their_kind():
    assert classify(errors.ConfigurationError("x")).kind == errors.TERMINAL
    assert classify(errors.DatabaseUnavailable("x")).kind == errors.TERMINAL
    assert classify(errors.SourceUnavailable("x")).kind == errors.TRANSIENT
    assert classify(errors.InjectedFault("x", errors.OUT_OF_MEMORY)).code == errors.OUT_OF_MEMORY
    try:  # a wrapper keeps the kind of what it wraps
        try:
            raise errors.DatabaseUnavailable("down for 200s")
        except errors.DatabaseUnavailable as inner:
            raise RuntimeError("publish failed") from inner
    except RuntimeError as outer:
        assert classify(outer).kind == errors.TERMINAL and not classify(outer).retryable


def test_source_unreachable_by_class():
    assert source_unreachable(errors.SourceUnavailable("x"))
    assert source_unreachable(FileNotFoundError("gone"))
    assert source_unreachable(java_error("org.postgresql.util.PSQLException", sql_state="28P01"))
    assert not source_unreachable(ValueError("a bug"))
    assert not source_unreachable(java_error("java.lang.RuntimeException", message="SQLException: text only"))


# ---------------------------------------------------------------- the retry helper


def _failing(exc: BaseException, succeed_on: int | None = None):
    calls = []

    def fn():
        calls.append(1)
        if succeed_on is not None and len(calls) == succeed_on:
            return "ok"
        raise exc

    return fn, calls


@pytest.mark.parametrize("policy", list(retry.POLICIES.values()), ids=list(retry.POLICIES))
def test_a_transient_error_gets_exactly_the_policys_attempts(policy):
    exc = java_error("org.apache.iceberg.exceptions.CommitFailedException")
    fn, calls = _failing(exc)
    waits = []
    with pytest.raises(type(exc)):
        retry.call(policy, fn, what="t", also=lambda _e: True, sleep=waits.append)
    assert len(calls) == policy.attempts
    assert waits == [policy.wait_s(i) for i in range(1, policy.attempts)]


def test_the_helper_stops_at_success_and_never_repeats_other_kinds():
    fn, calls = _failing(errors.InjectedFault("busy", errors.DATABASE_BUSY), succeed_on=3)
    assert retry.call(retry.METADATA_COMMIT, fn, what="t", sleep=lambda _s: None) == "ok" and len(calls) == 3

    for exc in (errors.ConfigurationError("no"), ValueError("a bug"),
                java_error("org.apache.iceberg.exceptions.ValidationException"),
                errors.SourceUnavailable("transient, but not a code this policy repeats")):
        fn, calls = _failing(exc)
        with pytest.raises(type(exc)):
            retry.call(retry.METADATA_COMMIT, fn, what="t", sleep=lambda _s: None)
        assert len(calls) == 1, exc

    # a terminal error is never repeated, whatever `also` says; `only` vetoes every repeat
    fn, calls = _failing(errors.DatabaseUnavailable("down"))
    with pytest.raises(errors.DatabaseUnavailable):
        retry.call(retry.BRANCH_WRITE, fn, what="t", also=lambda _e: True, sleep=lambda _s: None)
    assert len(calls) == 1
    fn, calls = _failing(errors.InjectedFault("conflict", errors.ICEBERG_COMMIT_CONFLICT))
    with pytest.raises(errors.InjectedFault):
        retry.call(retry.BRANCH_WRITE, fn, what="t", only=lambda _e: False, sleep=lambda _s: None)
    assert len(calls) == 1


def test_before_retry_runs_between_attempts():
    seen = []
    fn, calls = _failing(errors.InjectedFault("conflict", errors.ICEBERG_COMMIT_CONFLICT), succeed_on=2)
    retry.call(retry.METADATA_COMMIT, fn, what="t", before_retry=seen.append, sleep=lambda _s: None)
    assert len(calls) == 2 and len(seen) == 1 and isinstance(seen[0], errors.InjectedFault)


def test_no_message_sniffing_or_package_import_guards_left_outside_the_mapper():
    offenders = []
    for path in (REPO / "lakehouse").rglob("*.py"):
        text = path.read_text()
        for needle in ("_CONFLICT_MARKERS", "is_source_error", "except ImportError", "Cannot use branch\" not in"):
            if needle in text:
                offenders.append(f"{path.relative_to(REPO)}: {needle}")
    assert offenders == []
