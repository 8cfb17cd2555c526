"""Pools from throttles, on real persistent Dagster instances.

* `lakehouse metadata apply` and the throughput sensor sync max_concurrent throttles into the
  instance's pool limits; changing or deleting a throttle changes or removes the pool.
* With the queue daemon running real runs of real pipelines, no pool ever has more concurrent
  steps than its limit (measured from the runs' STEP_START / STEP_SUCCESS events), while the
  runs themselves do overlap (so the limit, not luck, kept the steps apart).
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
import yaml

from lakehouse.cli import main as cli_main
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.orchestration.pools import current_limits, sync_instance
from lakehouse.stage.runner import Platform
from tests.fixtures.ticks import tick as evaluate_tick

CODELOC = "tests.test_pools_codeloc"
COLUMNS = [{"name": "id", "type": "bigint"}, {"name": "v", "type": "string"}]


def throughput_metadata(pipelines: dict[str, str], throttles: list[dict], *, batch_files: int = 100,
                        source_path: str = "shared") -> dict:
    """One files source shared by one single-stage pipeline per entry of {pipeline_id: criticality}."""
    md: dict = {
        "pipelines": [{"pipeline_id": p, "criticality": c} for p, c in pipelines.items()],
        "sources": [{"source_id": "shared_src", "kind": "files", "format": "jsonl", "path": source_path,
                     "batch_files": batch_files, "columns": COLUMNS}],
        "targets": [{"target_id": f"t_{p}", "namespace": "bronze", "table": p} for p in pipelines],
        "stages": [{"pipeline_id": p, "stage_order": 1, "stage_name": "ingest", "layer": "bronze",
                    "source_id": "shared_src", "target_id": f"t_{p}"} for p in pipelines],
        "throttles": throttles,
    }
    return md


def apply(platform_or_store, md: dict, path: Path, replace: bool = False) -> None:
    path.write_text(yaml.safe_dump(md, sort_keys=False))
    store = platform_or_store if isinstance(platform_or_store, MetadataStore) else platform_or_store.store
    store.apply(load_metadata(path), replace=replace)


def write_rows(landing: Path, files: int, rows: int, prefix: str = "f") -> int:
    landing.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in range(files):
        with open(landing / f"{prefix}{f:04d}.jsonl", "w") as fh:
            for _i in range(rows):
                fh.write(json.dumps({"id": n, "v": f"r{n}"}) + "\n")
                n += 1
    return n


def persistent_instance(home: Path) -> dg.DagsterInstance:
    from tests.fixtures.dagster_daemon import write_instance_config

    write_instance_config(home, max_concurrent_runs=2, tag_concurrency_limits=None, default_pool_limit=3,
                          module="lakehouse_assets.definitions", location_name="lakehouse")
    return dg.DagsterInstance.from_config(str(home))


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Largest number of intervals open at one instant (an end at t closes before a start at t)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def test_metadata_apply_and_sensor_sync_pools(settings, tmp_path, monkeypatch):
    home = tmp_path / "dh"
    instance = persistent_instance(home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    md = throughput_metadata({"p1": "critical", "p2": "low"}, [
        {"throttle_id": "src_conc", "entity_type": "source", "entity_id": "shared_src", "metric": "max_concurrent",
         "threshold": 2},
        {"throttle_id": "t1_conc", "entity_type": "target", "entity_id": "t_p1", "metric": "max_concurrent",
         "threshold": 1},
        {"throttle_id": "src_rate", "entity_type": "source", "entity_id": "shared_src",
         "metric": "records_per_minute", "threshold": 1000},
    ])
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(md))
    # an operator's own pool is never touched by the sync
    instance.event_log_storage.set_concurrency_slots("warehouse_io", 7)

    assert cli_main(["metadata", "apply", str(f)]) == 0
    limits = current_limits(instance)
    assert limits["source:shared_src"] == (2, False)
    assert limits["target:t_p1"] == (1, False)
    assert "target:t_p2" not in limits  # no max_concurrent throttle -> no pool row (instance default applies)

    # metadata changes: threshold raised, target throttle removed -> pool updated / deleted, no manual step
    md["throttles"][0]["threshold"] = 5
    md["throttles"] = [t for t in md["throttles"] if t["throttle_id"] != "t1_conc"]
    f.write_text(yaml.safe_dump(md))
    assert cli_main(["metadata", "apply", str(f), "--replace"]) == 0
    limits = current_limits(instance)
    assert limits["source:shared_src"] == (5, False)
    assert "target:t_p1" not in limits
    assert limits["warehouse_io"] == (7, False)

    # a change made behind the CLI's back (plain SQL / another tool) is picked up by the sensor
    from lakehouse.metadata.model import Throttle

    store = MetadataStore(settings.control_db_url)
    store.upsert([Throttle(throttle_id="t2_conc", entity_type="target", entity_id="t_p2", metric="max_concurrent",
                           threshold=3)])
    from sensors.throughput import build_throughput_sensor

    sensor = build_throughput_sensor()
    result = evaluate_tick(sensor, instance=instance)
    assert "set target:t_p2=3" in result.skip_message
    assert current_limits(instance)["target:t_p2"] == (3, False)
    # idempotent: a second tick changes nothing
    again = sync_instance(instance, store.load())
    assert not again.changed and again.unchanged["target:t_p2"] == 3


def test_pools_show_and_sync_cli(settings, tmp_path, monkeypatch, capsys):
    home = tmp_path / "dh"
    instance = persistent_instance(home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    platform = Platform.from_env()
    apply(platform, throughput_metadata({"p1": "normal"}, [
        {"throttle_id": "c", "entity_type": "source", "entity_id": "shared_src", "metric": "max_concurrent",
         "threshold": 2}]), tmp_path / "m.yaml")
    assert cli_main(["pools", "show"]) == 0
    assert "no" in capsys.readouterr().out  # not yet in the instance
    assert cli_main(["pools", "sync"]) == 0
    assert current_limits(instance)["source:shared_src"] == (2, False)
    assert cli_main(["pools", "show"]) == 0
    out = capsys.readouterr().out
    assert "source:shared_src" in out and "yes" in out


@pytest.mark.timeout(1200)
def test_daemon_never_exceeds_pool_limits(settings, tmp_path, dagster_daemon_factory, postgres_server, postgres_db):
    """Four runs (3 pipelines on one source; two runs of p_a on one target), up to three at a time,
    through the real Definitions (step bodies hold their slot for 15 s: tests/test_pools_codeloc.py),
    on PostgreSQL instance storage as in production (deploy/dagster.yaml): Dagster's SQLite storage
    can hand one slot to two steps that claim it in the same instant."""
    platform = Platform.from_env()
    pipelines = {"p_a": "normal", "p_b": "normal", "p_c": "normal"}
    apply(platform, throughput_metadata(pipelines, [
        {"throttle_id": "src", "entity_type": "source", "entity_id": "shared_src", "metric": "max_concurrent",
         "threshold": 1},
        {"throttle_id": "ta", "entity_type": "target", "entity_id": "t_p_a", "metric": "max_concurrent",
         "threshold": 1},
    ]), tmp_path / "m.yaml")
    # all three runs start at once, so their steps really compete for the pools' slots
    d = dagster_daemon_factory(max_concurrent_runs=3, default_pool_limit=4, start=False, module=CODELOC,
                               block_op_concurrency_limited_runs=False,
                               extra_env={"LAKEHOUSE_TEST_STEP_SECONDS": "15"},
                               storage_url=postgres_server.sqlalchemy_url(postgres_db, driver="psycopg2"))
    sync_instance(d.instance, platform.store.load())  # what `metadata apply` does with DAGSTER_HOME set
    runs = [d.submit_pipeline(p, {"lakehouse/pipeline": p}) for p in ("p_a", "p_b", "p_a", "p_c")]
    d.start()
    finished = d.wait_for_runs(runs, timeout=1000)
    assert [r.status.value for r in finished] == ["SUCCESS"] * 4, d.failures(runs)

    per_pool: dict[str, list[tuple[float, float]]] = {}
    for run_id in runs:
        for step, interval in d.step_intervals(run_id).items():
            base, op = step.split(".")[-1].rsplit("__", 1)  # bronze__p_a.bronze__p_a__load -> bronze__p_a, load
            table = base.split("__", 1)[1]  # bronze__p_a -> p_a
            pool = "source:shared_src" if op == "extract" else f"target:t_{table}"
            per_pool.setdefault(pool, []).append(interval)
    assert len(per_pool["source:shared_src"]) == 4
    assert len(per_pool["target:t_p_a"]) == 2
    assert max_overlap(per_pool["source:shared_src"]) == 1
    assert max_overlap(per_pool["target:t_p_a"]) == 1
    # the runs did run side by side: the pools, not the run queue, kept the steps apart
    assert max_overlap([d.run_interval(r) for r in runs]) >= 2
