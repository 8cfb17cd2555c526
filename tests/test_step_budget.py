"""One attempt budget per step (issue 18 item 3): healing's re-runs and Dagster's retries draw from
the stage's retry policy (`max_retries`), so the attempts a step gets are the ones its policy
allows, never healing attempts × Dagster retries (docs/errors.md, "Who retries what").

Fast (no Spark): the real code location runs the pipeline's job in process, the step's work fails
at the fault hook's `extract` point (`LAKEHOUSE_FAULTS=fail:point=extract`, a transient 503), and
the hook counts how often the work ran.
"""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse.control import faults
from lakehouse.control.retry import attempts_used
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.settings import load_settings
from tests.conftest import seed_control_db


def pipeline_yaml(retry_policy: int | None, rule_attempts: int | None) -> str:
    policy = (f"retry_policies:\n  - {{retry_id: r, max_retries: {retry_policy}, delay_seconds: 0, backoff: constant, "
              "jitter: none}" if retry_policy is not None else "")
    rule = (f"healing_actions:\n  - {{healing_id: flaky, error_code: TRANSIENT_IO, actions: [retry_after_backoff], "
            f"max_attempts: {rule_attempts}, backoff_seconds: 0}}" if rule_attempts is not None else "")
    return f"""
pipelines:
  - {{pipeline_id: sb{", default_retry_id: r" if retry_policy is not None else ""}}}
sources:
  - {{source_id: sb_raw, kind: files, format: jsonl, path: sb, glob: "*.jsonl"}}
targets:
  - {{target_id: sb_bronze, namespace: bronze, table: sb, write_mode: append}}
stages:
  - {{pipeline_id: sb, stage_order: 1, stage_name: ingest, layer: bronze, source_id: sb_raw, target_id: sb_bronze}}
{policy}
{rule}
"""


@pytest.fixture
def platform(tmp_path, monkeypatch, control_db_at_head) -> Platform:
    seed_control_db(control_db_at_head, tmp_path)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME",
                "LAKEHOUSE_HEALING_MAX_ATTEMPTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(faults.ENV, "fail:point=extract")  # every run of the extract's work fails
    faults.reset()
    settings = load_settings()
    (settings.landing_dir / "sb").mkdir(parents=True)
    (settings.landing_dir / "sb" / "a.jsonl").write_text('{"id": 1}\n')
    yield Platform(settings, MetadataStore(settings.control_db_url))
    faults.reset()


def run(platform: Platform, tmp_path, retry_policy: int | None, rule_attempts: int | None):
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    f = tmp_path / "sb.yaml"
    f.write_text(pipeline_yaml(retry_policy, rule_attempts))
    platform.store.apply(load_metadata(f))
    job = pipeline_job(build_definitions(platform), "sb")
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    return result


def events(platform: Platform, run_id: str, event: str) -> list:
    return platform.store.audit_entries(run_id=run_id, event=event)


@pytest.mark.parametrize(("retry_policy", "rule_attempts", "cap", "heals", "dagster_retries"), [
    # healing alone used to give 3 heals in each of 1 + 3 executions (12 runs); now 1 + 3 in all
    (3, 2, None, 2, 1),
    (3, 20, None, 3, 0),   # a rule that would heal 20 times stops at the policy's 3
    (2, None, None, 0, 2),  # nothing heals: Dagster retries alone, as the policy says
    (0, 5, None, 0, 0),    # max_retries 0: one run, not even a heal
    (None, 20, "4", 4, 0),  # no policy: healing's cap is the budget, and Dagster never retries
])
def test_a_step_runs_as_often_as_its_budget_allows(platform, tmp_path, monkeypatch, retry_policy, rule_attempts,
                                                    cap, heals, dagster_retries):
    if cap is not None:
        monkeypatch.setenv("LAKEHOUSE_HEALING_MAX_ATTEMPTS", cap)
    result = run(platform, tmp_path, retry_policy, rule_attempts)
    budget = retry_policy if retry_policy is not None else int(cap)
    runs = faults.hits("fail", result.run_id)
    assert runs == 1 + budget, f"the extract ran {runs} times; its budget allows 1 + {budget}"

    heal_rows = [e for e in events(platform, result.run_id, "step_failed") if e.outcome == "healing"]
    retries = [e for e in events(platform, result.run_id, "retry") if e.outcome == "retry_requested"]
    assert (len(heal_rows), len(retries)) == (heals, dagster_retries)
    ups = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert len(ups) == dagster_retries
    assert attempts_used(platform.store, result.run_id, "sb", "ingest", "extract") == budget


def test_the_healing_audit_says_the_budget_stopped_it(platform, tmp_path):
    result = run(platform, tmp_path, 2, 20)
    stopped = [e for e in events(platform, result.run_id, "healing") if e.outcome == "exhausted"]
    assert stopped and "attempt budget is spent (2 re-attempt(s); retry policy 'r': max_retries 2)" in \
        stopped[-1].details["reason"]
    [not_retried] = [e for e in events(platform, result.run_id, "retry") if e.outcome == "not_retried"]
    assert not_retried.details["attempts_used"] == 2 and "exhausted" in not_retried.details["reason"]
