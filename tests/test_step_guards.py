"""Step timeouts derived from the audit log, JVM errors and timeouts classified by Java class, and
owner-only files (fast lane: no Spark)."""

from __future__ import annotations

import os
import stat

import pytest

from lakehouse import errors
from lakehouse.control.deadline import DEFAULT_CEILING_S, FLOOR_S, derive, past_durations
from lakehouse.errors import classify
from lakehouse.metadata.store import MetadataStore
from lakehouse.runtime.fileperms import configured_umask, hadoop_umask
from lakehouse.table.sqlite_files import prepare_sqlite
from tests.fixtures.py4j_like import java_error


def test_timeout_is_derived_from_past_durations_with_a_floor_and_a_ceiling():
    d = derive([], DEFAULT_CEILING_S)
    assert d.seconds == DEFAULT_CEILING_S and "no past run" in d.origin
    assert derive([10.0, 30.0], DEFAULT_CEILING_S).seconds == FLOOR_S  # 4 × 30 s is under the floor
    d = derive([400.0, 900.0, 650.0], DEFAULT_CEILING_S)
    assert d.seconds == 3600.0 and "4 × the slowest of the last 3 successful runs (900 s)" in d.origin
    d = derive([20000.0], 7200.0)
    assert d.seconds == 7200.0 and d.origin.startswith("the ceiling 7200 s")


def test_past_durations_are_the_stages_last_successful_loads(tmp_path):
    store = MetadataStore(f"sqlite:///{tmp_path / 'control.db'}")
    for i, ms in enumerate([5000, 7000, 9000]):
        store.audit(run_id=f"r{i}", pipeline_id="p", stage_name="s", event="published", outcome="success",
                    duration_ms=ms)
    store.audit(run_id="x", pipeline_id="p", stage_name="s", event="published", outcome="failed", duration_ms=10**8)
    store.audit(run_id="y", pipeline_id="p", stage_name="other", event="published", outcome="success", duration_ms=1)
    store.audit(run_id="z", pipeline_id="p", stage_name="s", event="healing", outcome="healed", duration_ms=10**8)
    assert past_durations(store, "p", "s") == [9.0, 7.0, 5.0]
    assert past_durations(store, "p", "s", n=2) == [9.0, 7.0]
    assert past_durations(store, "p", "missing") == []


@pytest.mark.parametrize(("exc", "code", "error_class"), [
    (java_error("org.apache.spark.SparkException", "java.lang.StackOverflowError",
                message="Job aborted due to stage failure: Task 0 failed"),
     errors.JVM_ERROR, "java.lang.StackOverflowError"),
    (java_error("org.apache.spark.SparkException", message="Job aborted: ExecutorLostFailure (executor 1 exited "
                "caused by one of the running tasks) Reason: Remote RPC client disassociated"), errors.JVM_ERROR,
     "org.apache.spark.SparkException"),
    (java_error("org.apache.spark.SparkException", "java.lang.OutOfMemoryError", message="Java heap space"),
     errors.OUT_OF_MEMORY, "java.lang.OutOfMemoryError"),
    (java_error("org.apache.spark.SparkException", message="Job 8 cancelled part of cancelled job group lakehouse-1"),
     errors.STEP_TIMEOUT, "org.apache.spark.SparkException"),
    (errors.StepTimeout("p.s load: ran longer than the step's timeout"), errors.STEP_TIMEOUT, "StepTimeout"),
    (java_error("org.apache.spark.sql.execution.QueryExecutionException", message="Parquet column cannot be "
                "converted in file file:/l/drift.parquet. Column: [amount], Expected: double, Found: BINARY"),
     errors.CORRUPT_INPUT, "org.apache.spark.sql.execution.QueryExecutionException"),
])
def test_jvm_errors_and_timeouts_are_classified_by_java_class(exc, code, error_class):
    info = classify(exc)
    assert (info.code, info.error_class) == (code, error_class)
    assert info.retryable  # they reach the healing rules and the retry policies


@pytest.fixture
def restore_umask():
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def test_sqlite_files_are_owner_only_by_default_and_configurable(tmp_path, monkeypatch, restore_umask):
    monkeypatch.delenv("LAKEHOUSE_UMASK", raising=False)
    assert (configured_umask(), hadoop_umask()) == (0o077, "077")
    db = tmp_path / "home" / "catalog.db"
    prepare_sqlite(f"sqlite:///{db}")
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in db.parent.iterdir())  # -wal / -shm too
    monkeypatch.setenv("LAKEHOUSE_UMASK", "027")
    other = tmp_path / "shared" / "control.db"
    MetadataStore(f"sqlite:///{other}").create_all()  # constructing a store alone creates nothing (issue 22)
    assert stat.S_IMODE(other.stat().st_mode) == 0o640 and hadoop_umask() == "027"
    monkeypatch.setenv("LAKEHOUSE_UMASK", "999")
    with pytest.raises(ValueError, match="LAKEHOUSE_UMASK='999' is not an octal umask"):
        configured_umask()


def test_steps_with_no_spark_work_start_no_jvm_for_their_deadline(settings, tmp_path):
    """A files stage with nothing new runs its extract and load under their deadlines without a
    SparkSession: the deadline binds to the session only when the step's work asks for one (this
    fast-lane test fails by name if a JVM starts)."""
    from lakehouse.metadata.loader import load_metadata
    from lakehouse.runtime import spark as spark_mod
    from lakehouse.stage.runner import Platform, StageRunner

    meta = tmp_path / "meta.yaml"
    meta.write_text("""
pipelines:
  - {pipeline_id: p}
sources:
  - {source_id: raw, kind: files, format: jsonl, path: in, glob: "*.jsonl"}
targets:
  - {target_id: t, namespace: b, table: events, write_mode: append}
stages:
  - {pipeline_id: p, stage_order: 1, stage_name: ingest, layer: bronze, source_id: raw, target_id: t}
""")
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.store.apply(load_metadata(meta))
    (settings.landing_dir / "in").mkdir(parents=True)
    runner = StageRunner(platform, "p", "ingest")
    plan = runner.extract()
    assert plan.skipped_reason.startswith("no new files in")
    out = runner.load(plan)
    assert out.published and out.rows_written == 0 and out.skipped_reason == plan.skipped_reason
    assert runner._deadline.seconds == DEFAULT_CEILING_S  # both steps ran under the deadline
    assert spark_mod.active_session() is None
