"""Error classification, rule matching and each built-in healing action as a plain function.

Actions run against a real StageRunner over a real control DB (no Spark needed for these);
the Spark-bound actions (refresh_and_recommit, evolve_schema, quarantine_input on a Spark read)
are proven end to end in test_healing_faults.py.
"""

from __future__ import annotations

import sys

import pytest

from lakehouse import errors
from lakehouse.control import faults
from lakehouse.control.healing import (
    ActionContext,
    command_argv,
    matches,
    matching_rules,
    restart_spark_session,
    retry_after_backoff,
    run_command,
    run_with_healing,
    schema_policy,
    shrink_batch,
    switch_to_recovery_path,
)
from lakehouse.errors import classify
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import HealingAction
from lakehouse.metadata.store import MetadataStore
from lakehouse.stage.runner import Batch, Platform, StageRunner
from tests.fixtures.py4j_like import java_error

# ---------------------------------------------------------------- classification


@pytest.mark.parametrize("exc,code", [
    (java_error("org.apache.iceberg.exceptions.CommitFailedException", message="Cannot commit: stale metadata"),
     errors.ICEBERG_COMMIT_CONFLICT),
    (java_error("org.apache.spark.SparkException", "java.lang.OutOfMemoryError", message="Java heap space"),
     errors.OUT_OF_MEMORY),
    (MemoryError(), errors.OUT_OF_MEMORY),
    (Exception("[INCOMPATIBLE_DATA_FOR_TABLE.EXTRA_COLUMNS] Cannot write incompatible data for the table"
               " `lake`.`b`.`t`: too many data columns: `extra`."), errors.SCHEMA_DRIFT),
    (Exception("[FAILED_READ_FILE.NO_HINT] Error while reading file file:/x/b.parquet."), errors.CORRUPT_INPUT),
    (RuntimeError("file:/x/b.parquet is not a Parquet file. Expected magic number"), errors.CORRUPT_INPUT),
    (ConnectionRefusedError(111, "Connection refused"), errors.SOURCE_UNAVAILABLE),
    (Exception("An error occurred (SlowDown) when calling the GetObject operation"), errors.TRANSIENT_IO),
    (TimeoutError("read timed out"), errors.TRANSIENT_IO),
    (errors.SourceUnavailable("x"), errors.SOURCE_UNAVAILABLE),
    (ValueError("a bug"), errors.UNKNOWN),
])
def test_classify(exc, code):
    assert classify(exc).code == code


def test_classify_follows_the_cause_chain_and_names_the_java_class():
    try:
        try:
            raise java_error("org.apache.iceberg.exceptions.CommitFailedException", message="conflict")
        except Exception as inner:
            raise RuntimeError("publish failed") from inner
    except RuntimeError as outer:
        info = classify(outer)
    assert info.code == errors.ICEBERG_COMMIT_CONFLICT
    assert info.error_class == "org.apache.iceberg.exceptions.CommitFailedException"
    assert "CommitFailedException" in info.class_names and "RuntimeError" in info.class_names


def test_decisions_are_not_retryable():
    from lakehouse.stage.runner import StageDisabled

    assert not classify(StageDisabled("pipeline x is disabled")).retryable
    assert classify(TimeoutError()).retryable


# ---------------------------------------------------------------- matching


def rule(**kw) -> HealingAction:
    return HealingAction(healing_id=kw.pop("healing_id", "r"), actions=kw.pop("actions", ["retry_after_backoff"]),
                         **kw)


def test_matchers_all_must_match():
    info = classify(TimeoutError("socket read timed out after 30s"))
    assert matches(rule(error_code="TRANSIENT_IO"), info)
    assert matches(rule(error_class="TimeoutError"), info)
    assert matches(rule(error_class="OSError"), info)  # a base class in the MRO
    assert matches(rule(message_regex=r"timed out after \d+s"), info)
    assert not matches(rule(error_code="TRANSIENT_IO", message_regex="nope"), info)
    assert not matches(rule(error_code="OUT_OF_MEMORY"), info)
    java = classify(java_error("org.apache.iceberg.exceptions.CommitFailedException", message="x"))
    assert matches(rule(error_class="CommitFailedException"), java)
    assert matches(rule(error_class="org.apache.iceberg.exceptions.CommitFailedException"), java)


def test_matching_rules_are_ordered_by_priority():
    info = classify(TimeoutError("x"))
    rules = [rule(healing_id="late", error_code="TRANSIENT_IO", priority=50),
             rule(healing_id="early", error_class="TimeoutError", priority=5),
             rule(healing_id="other", error_code="OUT_OF_MEMORY", priority=1)]
    assert [r.healing_id for r in matching_rules(rules, info)] == ["early", "late"]


def test_a_rule_needs_a_matcher_and_run_command_a_command():
    with pytest.raises(ValueError, match="needs error_class, message_regex or error_code"):
        HealingAction(healing_id="x", actions=["retry_after_backoff"])
    with pytest.raises(ValueError, match="no command"):
        HealingAction(healing_id="x", error_code="UNKNOWN", actions=["run_command"])


# ---------------------------------------------------------------- actions on a real runner


META = """
pipelines:
  - {pipeline_id: ha}
sources:
  - {source_id: ha_raw, kind: files, format: jsonl, path: ha, glob: "*.jsonl", batch_files: 8,
     alternative_source_id: ha_mirror}
  - {source_id: ha_mirror, kind: files, format: jsonl, path: ha_mirror, glob: "*.jsonl"}
targets:
  - {target_id: ha_bronze, namespace: bronze, table: ha}
stages:
  - {pipeline_id: ha, stage_order: 1, stage_name: ingest, layer: bronze, source_id: ha_raw, target_id: ha_bronze,
     validation_set_id: ha_rules}
validation_rules:
  - rule_set_id: ha_rules
    rules:
      - {name: contract, type: schema_contract, schema_policy: evolve, expected_columns: [{name: id, type: bigint}]}
"""


@pytest.fixture
def runner(settings, tmp_path, monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.delenv("LAKEHOUSE_HEALING_MAX_ATTEMPTS", raising=False)
    p = Platform(settings, MetadataStore(settings.control_db_url))
    f = tmp_path / "ha.yaml"
    f.write_text(META)
    p.store.apply(load_metadata(f))
    (settings.landing_dir / "ha_mirror").mkdir(parents=True)
    (settings.landing_dir / "ha_mirror" / "a.jsonl").write_text('{"id": 1}\n')
    (settings.landing_dir / "ha").mkdir(parents=True)
    return StageRunner(p, "ha", "ingest", run_id="unit-run")


def ctx_for(runner, exc, r: HealingAction, attempt: int = 1) -> ActionContext:
    return ActionContext(runner, classify(exc), exc, r, attempt, "load")


def test_retry_after_backoff_doubles_per_attempt(runner):
    waits = []
    r = rule(error_code="TRANSIENT_IO", backoff_seconds=1.5)
    for attempt in (1, 2, 3):
        res = retry_after_backoff(ctx_for(runner, TimeoutError(), r, attempt), sleep=waits.append)
        assert res.applied
    assert waits == [1.5, 3.0, 6.0]


def test_shrink_batch_halves_until_one(runner):
    from lakehouse.ingest.files import FileRef

    r = rule(error_code="OUT_OF_MEMORY", actions=["shrink_batch"])
    files = [FileRef(f"f{i}", 1, "e") for i in range(8)]
    sizes = []
    while True:
        n = runner.healing.effective_batch(runner.source.batch_files)
        runner.current_batch = Batch(df=None, files=files[:n])
        res = shrink_batch(ctx_for(runner, MemoryError(), r))
        if not res.applied:
            break
        sizes.append((res.data["batch_files"], res.data["batch_bytes"]))
    default_bytes = 256 * 1024**2  # the byte bound of a file batch is halved alike
    assert sizes == [(4, default_bytes // 2), (2, default_bytes // 4), (1, default_bytes // 8)]
    assert res.outcome == "not_applicable"


def test_schema_policy_comes_from_the_schema_contract_rule(runner):
    assert schema_policy(runner) == "evolve"
    runner.catalog.rule_set("ha_rules").rules[0].schema_policy = "freeze"
    assert schema_policy(runner) == "freeze"


def test_switch_to_recovery_path_reroutes_to_the_alternative(runner):
    r = rule(error_code="SOURCE_UNAVAILABLE", actions=["switch_to_recovery_path"])
    res = switch_to_recovery_path(ctx_for(runner, errors.SourceUnavailable("down"), r))
    assert res.applied and res.data["to"] == "ha_mirror"
    assert runner.source_override == "ha_mirror" and runner.source.source_id == "ha_mirror"


def test_restart_spark_session_stops_then_starts(runner):
    calls = []
    r = rule(error_code="SPARK_SESSION_DEAD", actions=["restart_spark_session"])
    res = restart_spark_session(ctx_for(runner, RuntimeError("SparkContext was shut down"), r),
                                stop=lambda: calls.append("stop"), start=lambda: calls.append("start"))
    assert res.applied and calls == ["stop", "start"]


def test_run_command_shell_entry_point_and_timeout(runner, tmp_path):
    out = tmp_path / "ran.txt"
    ok = rule(error_code="UNKNOWN", actions=["run_command"],
              command=f"{sys.executable} -c \"import os; open({str(out)!r}, 'w').write(os.environ['LAKEHOUSE_HEAL_ERROR_CODE'])\"")
    assert run_command(ctx_for(runner, ValueError("x"), ok)).applied
    assert out.read_text() == "UNKNOWN"

    failing = rule(error_code="UNKNOWN", actions=["run_command"], command=f"{sys.executable} -c 'raise SystemExit(3)'")
    res = run_command(ctx_for(runner, ValueError("x"), failing))
    assert res.outcome == "failed" and "exited 3" in res.detail

    slow = rule(error_code="UNKNOWN", actions=["run_command"], command="sleep 30", command_timeout_seconds=1)
    res = run_command(ctx_for(runner, ValueError("x"), slow))
    assert res.outcome == "failed" and "timed out after 1s" in res.detail

    entry = rule(error_code="UNKNOWN", actions=["run_command"], command="py:json:dumps")
    assert command_argv(entry.command)[0] == sys.executable
    with pytest.raises(ValueError, match="py:<module>:<function>"):
        command_argv("py:os.system('x'):y")


def test_run_with_healing_heals_then_stops_at_max_attempts(runner):
    calls = {"n": 0}
    rules = [rule(healing_id="t", error_code="TRANSIENT_IO", backoff_seconds=0, max_attempts=2)]

    def flaky():
        calls["n"] += 1
        if calls["n"] <= 2:
            raise TimeoutError("flaky")
        return "done"

    assert run_with_healing(runner, "extract", flaky, rules=lambda: rules) == "done"
    assert calls["n"] == 3
    outcomes = [(e.event, e.outcome) for e in runner.platform.store.audit_entries(run_id="unit-run")]
    assert outcomes == [("step_failed", "healing"), ("healing_action", "applied"),
                        ("step_failed", "healing"), ("healing_action", "applied"), ("healing", "healed")]

    def always():
        raise TimeoutError("never heals")

    with pytest.raises(TimeoutError):  # the rule's 2 attempts are spent for this step
        run_with_healing(runner, "extract", always, rules=lambda: rules)
    assert runner.platform.store.audit_entries(run_id="unit-run")[-1].outcome == "unhealed"


def test_a_failing_action_does_not_hide_the_error(runner):
    rules = [rule(healing_id="cmd", error_code="TRANSIENT_IO", actions=["run_command"],
                  command=f"{sys.executable} -c 'raise SystemExit(1)'")]

    def boom():
        raise TimeoutError("original")

    with pytest.raises(TimeoutError, match="original"):
        run_with_healing(runner, "extract", boom, rules=lambda: rules)


def test_faults_are_off_unless_configured(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.inject("extract", None, source_id="x")  # no-op
    monkeypatch.setenv(faults.ENV, "source_down:source=x")
    with pytest.raises(errors.SourceUnavailable):
        faults.inject("extract", None, source_id="x")
    faults.inject("extract", None, source_id="y")  # another source: no fault
    with pytest.raises(ValueError, match="unknown fault 'typo'"):
        faults.parse("typo:x=1")


def test_quarantine_input_leaves_a_vanished_file_for_the_next_run_instead_of_quarantining_it(runner):
    from lakehouse.control.healing import quarantine_input
    from lakehouse.ingest.files import local_etag
    from lakehouse.stage.core import Batch, FileRef

    path = runner.platform.settings.landing_dir / "ha" / "gone.jsonl"
    path.write_text('{"id": 1}\n')
    ref = FileRef("gone.jsonl", path.stat().st_size, local_etag(path), str(path))
    path.unlink()
    runner.current_batch = Batch(None, {}, [ref])
    exc = RuntimeError("[PATH_NOT_FOUND] Path does not exist: file:/x/gone.jsonl")
    res = quarantine_input(ctx_for(runner, exc, rule(error_code="CORRUPT_INPUT", actions=["quarantine_input"])))
    assert res.applied and res.data == {"deferred": ["gone.jsonl"]}
    assert "gone.jsonl" not in runner.healing.quarantined_files
    assert "vanished" in runner.healing.skipped_files["gone.jsonl"]
    assert runner.report["deferred_files"][0]["key"] == "gone.jsonl"
