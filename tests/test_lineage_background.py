"""Stage runs' DataHub emission beside a `lakehouse run` (lakehouse.lineage.background): in a child
process inside `in_background()`, one at a time in the stages' order, all of it over when the block
ends; in-process everywhere else. The emission itself is replaced by one that records where and
when it ran (the real one is covered by tests/test_datahub*.py and test_small_run_imports)."""

from __future__ import annotations

import gc
import json
import os
import time
from types import SimpleNamespace

import pytest

from lakehouse.lineage import background, datahub


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    log = tmp_path / "emitted.jsonl"

    def fake_emit(runner, plan, outcome, *, success):
        start = time.time()
        # slower than the caller, so a child must be waited for; the last stage longest: the caller
        # goes on while it runs (the other stages' children only need to outlast a fork)
        time.sleep(0.3 if runner.stage == "gold" else 0.1)
        with open(log, "a") as fh:
            fh.write(json.dumps({"stage": runner.stage, "pid": os.getpid(), "start": start, "end": time.time(),
                                 "success": success, "gc": gc.isenabled()}) + "\n")
        if runner.stage == "boom":
            raise RuntimeError("emission failed")

    monkeypatch.setattr(datahub, "emit_stage_run", fake_emit)
    monkeypatch.delenv(background.ENV, raising=False)
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _runner(stage: str):
    return SimpleNamespace(stage=stage, platform=SimpleNamespace(store=None))


def test_in_background_emits_in_children_in_order_and_waits(recorded):
    with background.in_background():
        for stage in ("bronze", "silver", "boom", "gold"):
            background.emit_stage_run(_runner(stage), None, None, success=True)
        returned = time.time()
    rows = recorded()
    # all of them, in order; the child that failed ("boom" raised in it) had its stage emitted again here
    assert [r["stage"] for r in rows] == ["bronze", "silver", "boom", "boom", "gold"]
    assert [r["pid"] == os.getpid() for r in rows] == [False, False, False, True, False]
    # a child collects no cycles (a full collection would copy the parent's heap); the parent still does
    assert [r["gc"] for r in rows] == [False, False, False, True, False] and gc.isenabled()
    assert all(a["end"] <= b["start"] for a, b in zip(rows, rows[1:], strict=False))  # one at a time
    assert rows[-1]["end"] > returned  # the caller went on while the last one ran; the block waited for it
    assert not background._pending and not background._state["enabled"]


def test_outside_the_block_or_switched_off_it_emits_in_process(recorded, monkeypatch):
    background.emit_stage_run(_runner("bronze"), None, None, success=False)
    monkeypatch.setenv(background.ENV, "0")
    with background.in_background():
        background.emit_stage_run(_runner("silver"), None, None, success=True)
    assert [(r["stage"], r["pid"], r["success"]) for r in recorded()] == [
        ("bronze", os.getpid(), False), ("silver", os.getpid(), True)]


def test_a_child_that_hangs_or_fails_is_killed_and_its_stage_emitted_in_process(tmp_path, monkeypatch, caplog):
    """A fork can inherit a lock another thread held and hang; a child can die. Neither may hang
    `lakehouse run` or lose the stage's lineage: the child is killed at the deadline (or found dead)
    and the stage emitted again in the run's own process."""
    log = tmp_path / "emitted.jsonl"
    parent = os.getpid()

    def fake_emit(runner, plan, outcome, *, success):
        if os.getpid() != parent:
            if runner.stage == "hangs":
                time.sleep(60)
            if runner.stage == "dies":
                os._exit(3)
        with open(log, "a") as fh:
            fh.write(json.dumps({"stage": runner.stage, "pid": os.getpid()}) + "\n")

    monkeypatch.setattr(datahub, "emit_stage_run", fake_emit)
    monkeypatch.delenv(background.ENV, raising=False)
    monkeypatch.setenv(background.TIMEOUT_ENV, "1")
    with background.in_background():
        for stage in ("bronze", "hangs", "dies", "gold"):
            background.emit_stage_run(_runner(stage), None, None, success=True)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["bronze", "hangs", "dies", "gold"]  # every stage, once, in order
    assert [r["pid"] == parent for r in rows] == [False, True, True, False]
    assert not background._pending
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "stage hangs was still running at the deadline and was killed" in warned
    assert "stage dies ended with 3" in warned


def test_the_emitter_is_imported_once_by_the_parent_before_the_first_fork(recorded, monkeypatch):
    """When no wait for the JVM imported acryl-datahub's emitter (the session was up before the
    first step asked), the parent of a Spark run imports it before forking: the children inherit it
    instead of each importing it again (~0.7 s of CPU per stage). A run without a session (the
    Arrow engine) leaves the import to its child, beside the run."""
    import lakehouse.runtime.spark

    imported: list[int] = []
    monkeypatch.setattr(background, "_import_emitter", lambda: imported.append(os.getpid()))
    monkeypatch.setattr(lakehouse.runtime.spark, "active_session", lambda: None)
    with background.in_background():
        background.emit_stage_run(_runner("bronze"), None, None, success=True)
    assert imported == []  # no session: not in the parent
    monkeypatch.setattr(lakehouse.runtime.spark, "active_session", lambda: object())
    with background.in_background():
        background.emit_stage_run(_runner("bronze"), None, None, success=True)
        background.emit_stage_run(_runner("silver"), None, None, success=True)
    assert imported == [os.getpid(), os.getpid()]  # in the parent, before each fork (a no-op once imported)
    assert [r["pid"] != os.getpid() for r in recorded()] == [True, True, True]
