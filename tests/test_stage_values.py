"""A stage as values (lakehouse.stage): request → plan → staged write → publish result.

The values are frozen and round-trip through JSON; a staged-write reference is enough to publish
the write from another process (the IO manager stores and loads it the same way); and the one step
wrapper (lakehouse.control.attempt) spends the step's one attempt budget for healing and the retry
policy together, under a real injected fault. Runs on the Arrow engine: no JVM.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.control import faults
from lakehouse.control.attempt import Once
from lakehouse.control.retry import retry_exception
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.stage import steps
from lakehouse.stage.values import (
    PublishResult,
    StagedWrite,
    StagePlan,
    StageRequest,
    outcome_from_dict,
    outcome_to_dict,
)


@pytest.fixture(autouse=True)
def _reset_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.delenv("LAKEHOUSE_HEALING_MAX_ATTEMPTS", raising=False)
    faults.reset()
    yield
    faults.reset()


@pytest.fixture
def lake(settings) -> Platform:
    """A platform on the test's settings; nothing here starts Spark."""
    return Platform(settings, MetadataStore(settings.control_db_url))


def apply(platform: Platform, tmp_path: Path, text: str) -> None:
    f = tmp_path / "meta.yaml"
    f.write_text(text)
    platform.store.apply(load_metadata(f))


def land(platform: Platform, pid: str, name: str, rows: list[dict]) -> None:
    path = platform.settings.landing_dir / pid / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def pipeline(pid: str, *, healing: str = "", retry: str = "") -> str:
    return f"""
pipelines:
  - {{pipeline_id: {pid}{", default_retry_id: r" if retry else ""}}}
{"retry_policies:" + chr(10) + "  - {retry_id: r, " + retry + ", delay_seconds: 0, backoff: constant, jitter: none}"
 if retry else ""}
sources:
  - {{source_id: {pid}_raw, kind: files, format: jsonl, path: {pid}, glob: "*.jsonl"}}
targets:
  - {{target_id: {pid}_bronze, namespace: bronze, table: {pid}, write_mode: append, engine: arrow}}
validation_rules:
  - rule_set_id: {pid}_rules
    rules:
      - {{name: id_present, type: not_null, columns: [id], severity: warn, action: quarantine}}
stages:
  - {{pipeline_id: {pid}, stage_order: 1, stage_name: ingest, layer: bronze, source_id: {pid}_raw,
     target_id: {pid}_bronze, validation_set_id: {pid}_rules}}
{"healing_actions:" + healing if healing else ""}
"""


def main_rows(platform: Platform, ident: str) -> int:
    s = platform.settings
    table = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse).load_table(ident)
    return table.scan().to_arrow().num_rows


def test_the_values_are_frozen_and_a_staged_write_round_trips_through_json(lake, tmp_path):
    apply(lake, tmp_path, pipeline("sv"))
    land(lake, "sv", "a.jsonl", [{"id": 1, "v": "a"}, {"id": None, "v": "b"}, {"id": 3, "v": "c"}])
    request = StageRequest("sv", "ingest", "values-run")
    planned = steps.plan(request, lake)  # each step in a working context of its own
    staged = steps.stage(request, planned, lake)

    assert planned.kind == "files" and [f.key for f in planned.files] == ["a.jsonl"]
    for value, name in ((request, "run_id"), (planned, "kind"), (staged, "branch")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, "changed")
    with pytest.raises(TypeError):
        planned.details["x"] = 1  # a mapping field is read-only too
    with pytest.raises(TypeError):
        staged.outcome["rows_written"] = 0

    # what the write step produced: the table, this run's branch, counts, checks and the quarantine branch
    assert staged.table == "bronze.sv" and staged.branch.startswith("audit_") and staged.publishes
    assert staged.engine == "arrow" and staged.staged_snapshot_id is not None
    assert staged.counts()["rows_written"] == 2 and staged.counts()["quarantined_rows"] == 1
    assert staged.quarantine is not None and staged.quarantine[0].startswith("bronze.sv")
    assert StagedWrite.from_json(staged.to_json()) == staged
    assert StagePlan.from_dict(json.loads(json.dumps(planned.to_dict()))) == planned
    assert StageRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    # the outcome inside it, checks (with their rule) and commits, comes back as the stage had it
    outcome = outcome_from_dict(staged.outcome, lake.catalog().target("sv_bronze"))
    assert outcome_to_dict(outcome) == dict(staged.outcome)
    [check] = outcome.checks
    assert check.rule.name == "id_present" and check.rule.action == "quarantine"
    assert [w.snapshot_id for w in outcome.writes] == [staged.staged_snapshot_id]
    with pytest.raises(ValueError, match="format"):
        StagedWrite.from_json(json.dumps({**json.loads(staged.to_json()), "format": 99}))
    assert main_rows(lake, "bronze.sv") == 0  # staged, not published


@pytest.mark.slow  # a real second interpreter: seconds of start-up
def test_a_stored_reference_is_enough_to_publish_in_a_fresh_process(lake, tmp_path):
    apply(lake, tmp_path, pipeline("pr"))
    land(lake, "pr", "a.jsonl", [{"id": i, "v": str(i)} for i in range(5)] + [{"id": None, "v": "x"}])
    request = StageRequest("pr", "ingest", "reference-run")
    staged = steps.stage(request, steps.plan(request, lake), lake)
    ref = tmp_path / "staged.json"
    ref.write_text(staged.to_json())  # what the IO manager stores

    # another interpreter, with nothing of this one: it loads the reference and publishes it
    code = ("import json, sys\n"
            "from lakehouse.platform import Platform\n"
            "from lakehouse.stage import steps\n"
            "from lakehouse.stage.values import StagedWrite\n"
            "staged = StagedWrite.from_json(open(sys.argv[1]).read())\n"
            "r = steps.publish(staged, Platform.from_env())\n"
            "print(json.dumps({'published': r.published, 'snapshot_id': r.snapshot_id, 'md': r.metadata()},"
            " default=str))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(ref)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["published"] and out["snapshot_id"] is not None
    assert out["md"]["rows_written"] == 5 and out["md"]["quarantined_rows"] == 1
    assert out["md"]["audit_branch"] == staged.branch

    assert main_rows(lake, "bronze.pr") == 5  # on main, once
    assert main_rows(lake, staged.quarantine[0]) == 1  # the quarantine branch published after it
    refs = lake.tables().refs_if_exists("bronze.pr") or {}
    assert staged.branch not in refs  # the publish dropped the audit branch
    # the file checkpoints rode with the commit: the next plan finds nothing new
    again = steps.plan(StageRequest("pr", "ingest", "reference-run-2"), lake)
    assert not again.files
    published = [e for e in lake.store.audit_entries(run_id="reference-run", event="published")]
    assert len(published) == 1 and published[0].outcome == "success"


def test_a_result_is_a_value_too(lake, tmp_path):
    apply(lake, tmp_path, pipeline("rv"))
    land(lake, "rv", "a.jsonl", [{"id": 1, "v": "a"}])
    request = StageRequest("rv", "ingest", "result-run")
    result = steps.publish(steps.stage(request, steps.plan(request, lake), lake), lake)
    assert isinstance(result, PublishResult) and result.published and result.table == "bronze.rv"
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.published = False
    assert result.metadata()["rows_written"] == 1 and result.metadata()["snapshot_id"] == str(result.snapshot_id)


def _retry(platform: Platform, pid: str, run_id: str, retry_number: int, step: str):
    """The step's retry policy as the Dagster layer binds it (lakehouse_assets.factory)."""
    return Once(lambda exc: retry_exception(platform, pid, "ingest", run_id, retry_number, exc, step))


def _reattempts(platform: Platform, run_id: str) -> tuple[int, int]:
    heals = [e for e in platform.store.audit_entries(run_id=run_id, event="step_failed") if e.outcome == "healing"]
    retries = [e for e in platform.store.audit_entries(run_id=run_id, event="retry") if e.outcome == "retry_requested"]
    return len(heals), len(retries)


def test_healing_and_the_retry_policy_spend_one_budget_per_step(lake, tmp_path, monkeypatch):
    """max_retries 2 and a healing rule allowing 10 heals: the step is re-attempted twice in all.
    Healing takes both, then the retry policy finds the budget spent and lets the step fail."""
    apply(lake, tmp_path, pipeline("bu", retry="max_retries: 2", healing="""
  - {healing_id: flaky, error_code: TRANSIENT_IO, actions: [retry_after_backoff], max_attempts: 10,
     backoff_seconds: 0}
"""))
    land(lake, "bu", "a.jsonl", [{"id": 1}])
    monkeypatch.setenv(faults.ENV, "fail:point=extract")  # a transient I/O error, forever
    request = StageRequest("bu", "ingest", "budget-run")
    with pytest.raises(Exception, match="503") as raised:
        steps.plan(request, lake, retry=_retry(lake, "bu", "budget-run", 0, "extract"))
    assert not isinstance(raised.value, dg.RetryRequested)
    assert _reattempts(lake, "budget-run") == (2, 0)
    [exhausted] = [e for e in lake.store.audit_entries(run_id="budget-run", event="healing")]
    assert exhausted.outcome == "exhausted" and "attempt budget is spent" in exhausted.details["reason"]
    [decision] = lake.store.audit_entries(run_id="budget-run", event="retry")
    assert decision.outcome == "not_retried" and decision.details["attempts_used"] == 2


def test_a_retry_request_and_the_heals_of_the_next_execution_share_the_budget(lake, tmp_path, monkeypatch):
    """max_retries 3, a rule that heals once per execution: heal, retry (Dagster's), heal, then the
    budget is spent: three re-attempts in all, whoever made them, and each error decided once."""
    apply(lake, tmp_path, pipeline("sh", retry="max_retries: 3", healing="""
  - {healing_id: once, error_code: TRANSIENT_IO, actions: [retry_after_backoff], max_attempts: 1,
     backoff_seconds: 0}
"""))
    land(lake, "sh", "a.jsonl", [{"id": 1}])
    monkeypatch.setenv(faults.ENV, "fail:point=extract")
    request = StageRequest("sh", "ingest", "shared-run")
    with pytest.raises(dg.RetryRequested) as first:  # execution 1: one heal, then the policy asks for a retry
        steps.plan(request, lake, retry=_retry(lake, "sh", "shared-run", 0, "extract"))
    assert first.value.max_retries == 3
    assert _reattempts(lake, "shared-run") == (1, 1)
    # execution 2 (Dagster's retry, retry_number 1): a fresh working context heals once more, then
    # the policy counts 1 + 1 + 1 re-attempts against max_retries 3 and lets the step fail
    with pytest.raises(Exception, match="503") as second:
        steps.plan(request, lake, retry=_retry(lake, "sh", "shared-run", 1, "extract"))
    assert not isinstance(second.value, dg.RetryRequested)
    assert sum(_reattempts(lake, "shared-run")) == 3
    decisions = [e.outcome for e in lake.store.audit_entries(run_id="shared-run", event="retry")]
    assert decisions == ["retry_requested", "not_retried"]  # one decision per failed execution


def test_once_decides_an_error_once():
    calls = []

    def policy(exc):
        calls.append(exc)
        return RuntimeError("retry please")

    once = Once(policy)
    err = ValueError("x")
    request = once(err)
    assert isinstance(request, RuntimeError)
    assert once(err) is None and once(request) is None  # the wrapper and the op's catch-all share it
    assert calls == [err]


def test_dates_and_decimals_in_a_plan_keep_their_type_through_json():
    import datetime
    import decimal

    details = {"at": datetime.datetime(2026, 11, 29, 3, 0, tzinfo=datetime.UTC),
               "day": datetime.date(2026, 11, 29), "amount": decimal.Decimal("12.50"), "n": [1, 2]}
    planned = StagePlan("p", "s", "jdbc", details=details)
    staged = StagedWrite(StageRequest("p", "s", "r"), planned, "b.t", "audit_r")
    back = StagedWrite.from_json(staged.to_json())
    assert back == staged and back.plan.extract_plan().details == details
    assert type(back.plan.details["at"]) is datetime.datetime and type(back.plan.details["amount"]) is decimal.Decimal


def test_the_runner_facade_publishes_a_stored_reference_too(lake, tmp_path):
    from lakehouse.stage.runner import StageRunner

    apply(lake, tmp_path, pipeline("fa"))
    land(lake, "fa", "a.jsonl", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    runner = StageRunner(lake, "fa", "ingest", run_id="facade-run")
    ref = runner.reference(runner.write_and_audit(runner.extract())).to_json()
    outcome = StageRunner(lake, "fa", "ingest", run_id="facade-run").publish(StagedWrite.from_json(ref))
    assert outcome.published and outcome.rows_written == 2 and main_rows(lake, "bronze.fa") == 2


def test_the_healing_state_round_trips_every_field():
    """Every field of HealingState travels in a staged-write reference: a field added to the state
    and forgotten here would reach the publish step with its default (or in another field's place)."""
    import dataclasses
    from collections import Counter

    from lakehouse.stage.core import HealingState
    from lakehouse.stage.values import healing_from_dict, healing_to_dict

    state = HealingState(batch_scale=0.5, quarantined_files={"a.json": "bad page"},
                         skipped_files={"b.json": "vanished"}, attempts=Counter({"heal_1": 2}), total_attempts=2,
                         events=[{"healing_id": "heal_1", "outcome": "applied"}])
    assert {f.name for f in dataclasses.fields(HealingState)} == set(healing_to_dict(state))
    back = healing_from_dict(json.loads(json.dumps(healing_to_dict(state))))
    assert back == state
