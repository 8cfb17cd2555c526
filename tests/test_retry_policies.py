"""Retry policies: delay schedules, policy lookup (stage, then pipeline default), and Dagster retries
driven by the control DB at run time (a plain SQL UPDATE changes the next run's behaviour)."""

from __future__ import annotations

import random

import dagster as dg
import pytest
import sqlalchemy as sa

from lakehouse.control import faults
from lakehouse.control.retry import base_delay, decide, delay, policy_for, schedule
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import RetryPolicy
from lakehouse.metadata.store import MetadataStore
from lakehouse.stage.runner import Platform


def test_backoff_shapes():
    const = RetryPolicy(retry_id="c", max_retries=4, delay_seconds=2, backoff="constant", jitter="none")
    lin = RetryPolicy(retry_id="l", max_retries=4, delay_seconds=2, backoff="linear", jitter="none")
    exp = RetryPolicy(retry_id="e", max_retries=4, delay_seconds=2, backoff="exponential", jitter="none")
    assert schedule(const) == [2, 2, 2, 2]
    assert schedule(lin) == [2, 4, 6, 8]
    assert schedule(exp) == [2, 4, 8, 16]
    assert schedule(RetryPolicy(retry_id="z", max_retries=0)) == []


def test_jitter_stays_in_its_band_and_delays_are_capped():
    rng = random.Random(3)
    pm = RetryPolicy(retry_id="p", max_retries=3, delay_seconds=10, backoff="constant", jitter="plus_minus")
    full = RetryPolicy(retry_id="f", max_retries=3, delay_seconds=10, backoff="constant", jitter="full")
    for _ in range(200):
        assert 7.5 <= delay(pm, 1, rng) <= 12.5
        assert 0 <= delay(full, 1, rng) <= 10
    huge = RetryPolicy(retry_id="h", max_retries=100, delay_seconds=60, backoff="exponential", jitter="none")
    assert base_delay(huge, 50) == 3600


POLICY_YAML = """
pipelines:
  - {pipeline_id: rp, default_retry_id: pipeline_default}
sources:
  - {source_id: rp_raw, kind: files, format: jsonl, path: rp, glob: "*.jsonl"}
targets:
  - {target_id: rp_a, namespace: bronze, table: rp_a}
  - {target_id: rp_b, namespace: bronze, table: rp_b}
stages:
  - {pipeline_id: rp, stage_order: 1, stage_name: a, layer: bronze, source_id: rp_raw, target_id: rp_a}
  - {pipeline_id: rp, stage_order: 2, stage_name: b, layer: bronze, source_id: rp_raw, target_id: rp_b,
     retry_id: stage_specific}
retry_policies:
  - {retry_id: pipeline_default, max_retries: 2, delay_seconds: 0, backoff: constant, jitter: none}
  - {retry_id: stage_specific, max_retries: 5, delay_seconds: 1, backoff: linear, jitter: none}
"""


@pytest.fixture
def rp_platform(settings, tmp_path):
    p = Platform(settings, MetadataStore(settings.control_db_url))
    f = tmp_path / "rp.yaml"
    f.write_text(POLICY_YAML)
    p.store.apply(load_metadata(f))
    return p


def test_stage_policy_wins_over_the_pipeline_default(rp_platform):
    cat = rp_platform.catalog()
    assert policy_for(cat, "rp", "a").retry_id == "pipeline_default"
    assert policy_for(cat, "rp", "b").retry_id == "stage_specific"
    d = decide(cat, "rp", "b", retry_number=2)
    assert d.retry and d.max_retries == 5 and d.seconds_to_wait == 3.0
    assert not decide(cat, "rp", "a", retry_number=2).retry  # 2 retries used up
    assert not decide(cat, "rp", "b", retry_number=0, retryable=False).retry


def test_dagster_retries_follow_the_control_db_at_run_time(rp_platform, spark, monkeypatch):
    """Two transient failures, max_retries 2 → the run succeeds after 2 Dagster retries. Then a SQL
    UPDATE to max_retries 0 makes the very same Definitions object fail: no reload needed."""
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    rp_platform.spark()  # bind the test's catalog on the session
    land = rp_platform.settings.landing_dir / "rp"
    land.mkdir(parents=True)
    (land / "a.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    faults.reset()
    monkeypatch.setenv(faults.ENV, "fail:point=extract,stage=a,times=2")
    defs = build_definitions(rp_platform)
    job = pipeline_job(defs, "rp")

    ok = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert ok.success
    retries = rp_platform.store.audit_entries(run_id=ok.run_id, event="retry")
    assert [(e.outcome, e.details["retry_number"]) for e in retries] == [("retry_requested", 0),
                                                                        ("retry_requested", 1)]
    assert {e.action for e in retries} == {"pipeline_default"}
    restarts = [e for e in ok.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert len(restarts) == 2

    with rp_platform.store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE retry_policies SET max_retries = 0 WHERE retry_id = :r"),
                     {"r": "pipeline_default"})
    failed = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not failed.success
    [entry] = rp_platform.store.audit_entries(run_id=failed.run_id, event="retry")
    assert entry.outcome == "not_retried" and "exhausted" in entry.details["reason"]
    faults.reset()
