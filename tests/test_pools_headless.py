"""Pools hold for headless runs: `lakehouse run` without DAGSTER_HOME uses the persistent instance
under LAKEHOUSE_HOME (created from deploy/dagster.dev.yaml), so two `lakehouse run` processes on
one source with max_concurrent 1 never read it at the same time. And the instance's SQLite storage
hands a slot to one claimer at a time even when processes claim in the same instant (Dagster's
stock SQLite claim does not: lakehouse/compat/dagster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from tests.test_pools import max_overlap

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_two_headless_runs_respect_a_pool_limit_of_one(settings, tmp_path, monkeypatch):
    md = {
        "pipelines": [{"pipeline_id": p} for p in ("h_a", "h_b")],
        "sources": [{"source_id": "shared_src", "kind": "files", "format": "jsonl", "path": "shared",
                     "columns": [{"name": "id", "type": "bigint"}, {"name": "v", "type": "string"}]}],
        "targets": [{"target_id": f"t_{p}", "namespace": "bronze", "table": p} for p in ("h_a", "h_b")],
        "stages": [{"pipeline_id": p, "stage_order": 1, "stage_name": "ingest", "layer": "bronze",
                    "source_id": "shared_src", "target_id": f"t_{p}"} for p in ("h_a", "h_b")],
        "throttles": [{"throttle_id": "one_reader", "entity_type": "source", "entity_id": "shared_src",
                       "metric": "max_concurrent", "threshold": 1}],
    }
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(md))
    landing = settings.landing_dir / "shared"
    landing.mkdir(parents=True)
    (landing / "f1.jsonl").write_text("".join(json.dumps({"id": i, "v": f"r{i}"}) + "\n" for i in range(50)))
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # headless, no instance configured
    env.update({"LAKEHOUSE_SPARK_MASTER": "local[1]", "PYTHONDONTWRITEBYTECODE": "1",
                # the extract step holds the source's slot for 12 s: a slow source
                "LAKEHOUSE_FAULTS": "sleep:point=extract,seconds=12"})
    applied = subprocess.run([str(BIN / "lakehouse"), "metadata", "apply", str(f)], env=env, capture_output=True,
                             text=True, timeout=300)
    assert applied.returncode == 0, applied.stderr
    home = settings.home / "dagster_home"
    assert "set source:shared_src=1" in applied.stdout and str(home) in applied.stdout

    # Each process writes its own Iceberg catalog file: what is under test is the Dagster instance
    # they share (pools) and the control DB; two JVMs creating their first namespace in ONE embedded
    # SQLite catalog at once can fail with SQLITE_BUSY_SNAPSHOT, a catalog matter outside this test.
    procs = [subprocess.Popen([str(BIN / "lakehouse"), "run", p], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "LAKEHOUSE_CATALOG_URI": f"sqlite:///{settings.home / p}.db",
                                              "LAKEHOUSE_WAREHOUSE": f"file://{settings.home / p}_warehouse"})
             for p in ("h_a", "h_b")]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"{out}\n{err[-3000:]}"
        assert "NOT enforced" not in err

    monkeypatch.setenv("DAGSTER_HOME", str(home))  # read what the two processes recorded
    instance = dg.DagsterInstance.from_config(str(home))
    runs = instance.get_runs()
    assert sorted(r.tags["lakehouse/pipeline"] for r in runs) == ["h_a", "h_b"]
    extracts, starts = [], []
    for run in runs:
        steps = {}
        for rec in instance.all_logs(run.run_id, of_type={dg.DagsterEventType.STEP_START,
                                                           dg.DagsterEventType.STEP_SUCCESS,
                                                           dg.DagsterEventType.RUN_START}):
            ev = rec.dagster_event
            if ev.event_type == dg.DagsterEventType.RUN_START:
                starts.append(rec.timestamp)
            elif ev.step_key.endswith("__extract"):
                steps.setdefault(ev.step_key, []).append(rec.timestamp)
        (interval,) = steps.values()
        extracts.append(tuple(interval))
    assert all(e - s >= 12 for s, e in extracts)
    assert max_overlap(extracts) == 1, extracts
    # the second run had started while the first held the slot: the pool, not the timing, kept them apart
    first_end = min(e for _, e in extracts)
    assert max(starts) < first_end, (starts, extracts)
    assert {p.name for p in instance.event_log_storage.get_pool_limits()} >= {"source:shared_src"}


WORKER = textwrap.dedent("""
    import json, sys, time, uuid
    import dagster as dg
    home, n, out, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    storage = dg.DagsterInstance.from_config(home).event_log_storage
    run_id, held = uuid.uuid4().hex, []
    while time.time() < go:
        time.sleep(0.001)
    for i in range(n):
        while not storage.claim_concurrency_slot("source:hot", run_id, f"s{i}").is_claimed:
            time.sleep(0.005)
        t0 = time.time(); time.sleep(0.02); t1 = time.time()
        storage.free_concurrency_slot_for_step(run_id, f"s{i}")
        held.append((t0, t1))
    json.dump(held, open(out, "w"))
""")


def test_sqlite_pool_slots_go_to_one_claimer_at_a_time(tmp_path, monkeypatch):
    """Four processes taking turns on a pool of limit 1, claims started in the same instant.
    With Dagster's stock SQLite storage this setup measured an overlap of 2 here; the platform's
    storage (deploy/dagster.dev.yaml) must never let two hold the slot."""
    home = tmp_path / "dh"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "deploy" / "dagster.dev.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = dg.DagsterInstance.from_config(str(home))
    instance.event_log_storage.set_concurrency_slots("source:hot", 1)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    go = time.time() + 10  # every process imports dagster first, then all start claiming together
    procs = [subprocess.Popen([sys.executable, str(script), str(home), "30", str(tmp_path / f"o{i}.json"), str(go)],
                              env={**os.environ, "DAGSTER_HOME": str(home)}) for i in range(4)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    held = [tuple(x) for i in range(4) for x in json.loads((tmp_path / f"o{i}.json").read_text())]
    assert len(held) == 120
    assert max_overlap(held) == 1
