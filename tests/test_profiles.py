"""Scheduling profiles: resolution, priorities, tags at request time, re-tagging queued runs, and
on a real instance with the queue daemon, a profile switch re-ordering runs already queued."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse.cli import main as cli_main
from lakehouse.metadata.model import PipelineProfile, ProfileSetting
from lakehouse.orchestration.queue import request_tags, retag_queued_runs
from lakehouse.stage.runner import Platform
from lakehouse.throughput.profiles import (
    PRIORITY_TAG,
    PROFILE_TAG,
    RESERVE_TAG,
    QueueLoad,
    RunInfo,
    active_profile,
    priority,
    profile_settings,
    reserve_key,
)
from tests.fixtures.ticks import tick as evaluate_tick
from tests.test_pools import CODELOC, apply, throughput_metadata

PIPES = {"p_low": "low", "p_norm": "normal", "p_high": "high", "p_crit": "critical"}


@pytest.fixture
def tplatform(settings, tmp_path) -> Platform:
    platform = Platform.from_env()
    apply(platform, throughput_metadata(PIPES, []), tmp_path / "m.yaml")
    return platform


def test_profile_resolution_global_and_override(tplatform):
    store = tplatform.store
    assert active_profile(store.load(), "p_low") == "balanced"  # nothing set: balanced
    assert cli_main(["profile", "set", "focus"]) == 0
    assert cli_main(["profile", "set", "balanced", "--pipeline", "p_low"]) == 0
    cat = store.load()
    assert active_profile(cat) == "focus"
    assert active_profile(cat, "p_norm") == "focus"
    assert active_profile(cat, "p_low") == "balanced"
    # bad input: clear errors, nothing written
    assert cli_main(["profile", "set", "turbo"]) == 2
    assert cli_main(["profile", "set", "focus", "--pipeline", "nope"]) == 2
    assert active_profile(store.load()) == "focus"


def test_focus_orders_by_criticality_and_reserves_only_for_lower_priority(tplatform):
    cat = tplatform.store.load()
    s = profile_settings(cat, "focus")
    infos = {p: RunInfo(p, c, ("source:shared_src", f"target:t_{p}"), 60.0) for p, c in PIPES.items()}
    prios = {p: priority("focus", s, i) for p, i in infos.items()}
    assert prios["p_crit"] > prios["p_high"] > prios["p_norm"] > prios["p_low"]
    # a long critical run still beats a short high one
    assert priority("focus", s, RunInfo("x", "critical", (), 3600.0)) > priority("focus", s, RunInfo("y", "high", (), 1))
    assert reserve_key("focus", infos["p_low"]) == "standard:source:shared_src"
    assert reserve_key("focus", infos["p_crit"]).startswith("open:")
    assert reserve_key("balanced", infos["p_low"]).startswith("open:")
    # a profile_settings row tunes the weights
    tplatform.store.upsert([ProfileSetting(profile_id="focus", setting_key="priority_weight_low", setting_value=5000)])
    s2 = profile_settings(tplatform.store.load(), "focus")
    assert priority("focus", s2, infos["p_low"]) > priority("focus", s2, infos["p_crit"])


def test_balanced_prefers_short_runs_and_idle_sources(tplatform):
    s = profile_settings(tplatform.store.load(), "balanced")
    short = RunInfo("a", "low", ("source:x", "target:a"), 60.0)
    long_ = RunInfo("b", "critical", ("source:y", "target:b"), 1800.0)
    assert priority("balanced", s, short) > priority("balanced", s, long_)  # criticality ignored, SJF
    hot = QueueLoad.of([RunInfo("q1", pools=("source:x",)), RunInfo("q2", pools=("source:x",))])
    on_hot = RunInfo("c", "normal", ("source:x", "target:c"), 60.0)
    on_idle = RunInfo("d", "normal", ("source:z", "target:d"), 60.0)
    assert priority("balanced", s, on_idle, hot) > priority("balanced", s, on_hot, hot)


def test_new_runs_get_the_profile_active_now(tplatform):
    store = tplatform.store
    before = request_tags(store, "p_crit")
    assert before[PROFILE_TAG] == "balanced"
    store.upsert([PipelineProfile(pipeline_id="*", profile_id="focus")])  # e.g. plain SQL / CLI, no redeploy
    after = request_tags(store, "p_crit")
    assert after[PROFILE_TAG] == "focus" and int(after[PRIORITY_TAG]) > int(before[PRIORITY_TAG])
    assert request_tags(store, "p_low")[RESERVE_TAG] == "standard:source:shared_src"

    # the metadata-built schedule asks for these tags at evaluation time
    from lakehouse.metadata.model import Pipeline
    from schedules import build_schedules

    p = store.load().pipeline("p_crit")
    store.upsert([Pipeline(**{**p.model_dump(), "schedule": "*/5 * * * *"})])
    (sched,) = build_schedules(store.load())
    instance = dg.DagsterInstance.ephemeral()
    req = evaluate_tick(sched, instance=instance).run_requests[0]
    assert req.tags[PRIORITY_TAG] == after[PRIORITY_TAG] and req.tags[PROFILE_TAG] == "focus"
    store.set_enabled("pipeline", "p_crit", False, by="test")  # the kill switch, read at each evaluation
    tick = evaluate_tick(sched, instance=instance)
    assert not tick.run_requests and "p_crit" in str(tick.skip_message)


def test_retag_queued_runs_on_a_persistent_instance(tplatform, tmp_path, monkeypatch, dagster_daemon_factory):
    d = dagster_daemon_factory(max_concurrent_runs=1, start=False, module=CODELOC)  # no daemon: runs stay QUEUED
    instance = d.instance
    store = tplatform.store
    queued = {p: d.submit_pipeline(p, request_tags(store, p, instance)) for p in PIPES}
    assert {instance.get_run_by_id(r).status for r in queued.values()} == {dg.DagsterRunStatus.QUEUED}
    prios = {p: int(instance.get_run_by_id(r).tags[PRIORITY_TAG]) for p, r in queued.items()}
    # balanced ignores criticality; each run sees the ones queued before it on the same source: FIFO
    assert sorted(PIPES, key=lambda p: -prios[p]) == list(PIPES)

    from_ui = d.submit_pipeline("p_high")  # a UI "Materialize" of p_high's assets: no tags at all

    monkeypatch.setenv("DAGSTER_HOME", str(d.home))
    assert cli_main(["profile", "set", "focus"]) == 0  # re-tags at once through the instance
    ui_tags = instance.get_run_by_id(from_ui).tags  # known by its selection: its pipeline and profile
    assert ui_tags["lakehouse/pipeline"] == "p_high" and ui_tags[PROFILE_TAG] == "focus" and PRIORITY_TAG in ui_tags
    tags = {p: instance.get_run_by_id(r).tags for p, r in queued.items()}
    order = sorted(PIPES, key=lambda p: -int(tags[p][PRIORITY_TAG]))
    assert order == ["p_crit", "p_high", "p_norm", "p_low"]
    assert all(t[PROFILE_TAG] == "focus" for t in tags.values())
    assert tags["p_low"][RESERVE_TAG] == "standard:source:shared_src"
    assert tags["p_crit"][RESERVE_TAG].startswith("open:")
    assert retag_queued_runs(instance, store) == []  # nothing left to change


@pytest.mark.timeout(1200)
def test_daemon_profile_switch_reorders_queued_runs(settings, tmp_path, dagster_daemon_factory, monkeypatch):
    """Real queue daemon, one run at a time: runs queued low -> normal -> critical under balanced
    (FIFO order) leave the queue critical -> normal -> low after `lakehouse profile set focus`.
    Real Definitions; step bodies only hold their slot (tests/test_pools_codeloc.py)."""
    platform = Platform.from_env()
    pipes = {"p_low": "low", "p_norm": "normal", "p_crit": "critical"}
    apply(platform, throughput_metadata(pipes, []), tmp_path / "m.yaml")
    d = dagster_daemon_factory(max_concurrent_runs=1, start=False, module=CODELOC,
                               extra_env={"LAKEHOUSE_TEST_STEP_SECONDS": "1"})
    runs = {p: d.submit_pipeline(p, request_tags(platform.store, p, d.instance)) for p in pipes}
    before = {p: int(d.instance.get_run_by_id(r).tags[PRIORITY_TAG]) for p, r in runs.items()}
    assert sorted(pipes, key=lambda p: -before[p]) == ["p_low", "p_norm", "p_crit"]  # balanced: FIFO

    monkeypatch.setenv("DAGSTER_HOME", str(d.home))
    assert cli_main(["profile", "set", "focus"]) == 0
    d.start()
    finished = d.wait_for_runs(runs.values(), timeout=1000)
    assert all(r.status.value == "SUCCESS" for r in finished), d.failures(runs.values())
    started = sorted(pipes, key=lambda p: d.run_interval(runs[p])[0])
    assert started == ["p_crit", "p_norm", "p_low"]
