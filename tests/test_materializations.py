"""A materialization means data changed (issue 39, item 3).

A stage step that changed no data (nothing new, a kill switch) and that no later step of its run
reads yields no output: Dagster records no materialization, and the step logs an observation
saying "nothing new since snapshot S" and why. A full recompute whose result has main's content
fingerprint publishes nothing. A stage whose table another stage of the same run reads still yields
its output (Dagster starts a step only once every upstream step yielded its output), so a reader of
several tables runs whenever one of them changed.

Arrow-engine pipelines (no JVM), through real `lakehouse run`s in process; the Dagster side is read
through the instance's public queries. The time-partitioned side (one materialization per period
written, then per period backfilled) runs on Spark: tests/test_incremental.py.
"""

from __future__ import annotations

import json

import dagster as dg
import pytest

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from tests.test_wap_helpers import rows_of

META = """
pipelines:
  - {pipeline_id: ab}
  - {pipeline_id: solo}
sources:
  - {source_id: a_raw, kind: files, format: jsonl, path: a, glob: "*.jsonl"}
  - {source_id: b_raw, kind: files, format: jsonl, path: b, glob: "*.jsonl"}
  - {source_id: c_raw, kind: files, format: jsonl, path: c, glob: "*.jsonl"}
targets:
  - {target_id: a_bronze, namespace: bronze, table: a, engine: arrow}
  - {target_id: b_bronze, namespace: bronze, table: b, engine: arrow}
  - {target_id: ab_gold, namespace: gold, table: ab, engine: arrow, write_mode: overwrite}
  - {target_id: c_bronze, namespace: bronze, table: c, engine: arrow}
stages:
  - {pipeline_id: ab, stage_order: 1, stage_name: load_a, layer: bronze, source_id: a_raw, target_id: a_bronze}
  - {pipeline_id: ab, stage_order: 2, stage_name: load_b, layer: bronze, source_id: b_raw, target_id: b_bronze}
  - {pipeline_id: ab, stage_order: 3, stage_name: counts, layer: gold, target_id: ab_gold, sql_engine: duckdb,
     transformation: "SELECT (SELECT COUNT(*) FROM bronze.a) AS a_rows, (SELECT COUNT(*) FROM bronze.b) AS b_rows"}
  - {pipeline_id: solo, stage_order: 1, stage_name: load_c, layer: bronze, source_id: c_raw, target_id: c_bronze}
"""

A, B, C, GOLD = (dg.AssetKey(["bronze", "a"]), dg.AssetKey(["bronze", "b"]), dg.AssetKey(["bronze", "c"]),
                 dg.AssetKey(["gold", "ab"]))


@pytest.fixture
def lake(settings, tmp_path):
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    f = tmp_path / "ab.yaml"
    f.write_text(META)
    platform.store.apply(load_metadata(f))
    return platform


def land(platform, folder: str, name: str, ids: list[int]) -> None:
    out = platform.settings.landing_dir / folder
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))


def materializations(instance: dg.DagsterInstance, key: dg.AssetKey) -> list[dg.EventLogRecord]:
    return list(instance.fetch_materializations(key, limit=1000).records)


def observations(instance: dg.DagsterInstance, key: dg.AssetKey) -> list[dg.AssetObservation]:
    return [r.asset_observation for r in instance.fetch_observations(key, limit=1000).records]


def run(capsys, pipeline: str) -> str:
    capsys.readouterr()
    assert cli(["run", pipeline]) == 0
    return capsys.readouterr().out


def test_a_no_op_run_adds_no_materialization_and_says_why(lake, capsys):
    """A one-stage pipeline run again with no new file: the stage's history gets no materialization,
    an observation "nothing new since snapshot S: no new files ..." instead; the summary says skipped."""
    instance = dg.DagsterInstance.get()
    land(lake, "c", "1", [1, 2])
    run(capsys, "solo")
    first = materializations(instance, C)
    assert len(first) == 1
    snap = first[0].asset_materialization.metadata["snapshot_id"].value

    out = run(capsys, "solo")
    assert "skipped" in out and "no new files" in out, out
    assert len(materializations(instance, C)) == 1  # nothing changed: no new materialization
    obs = observations(instance, C)
    assert len(obs) == 1 and obs[0].description.startswith(f"nothing new since snapshot {snap}: no new files"), obs
    assert obs[0].metadata["nothing_new_since_snapshot"].value == snap

    land(lake, "c", "2", [3])  # new data: a materialization again
    run(capsys, "solo")
    assert len(materializations(instance, C)) == 2
    assert len(rows_of(lake, "bronze.c")) == 3


def test_a_recompute_identical_to_main_publishes_nothing_and_a_reader_of_two_tables_runs_when_one_changed(
        lake, capsys):
    """gold.ab is a full recompute of bronze.a and bronze.b. Run again with nothing new: its result
    equals main's (same content fingerprint), so nothing is published and no materialization recorded.
    Then only b gets new rows: a has nothing new, yet gold runs (a yields its output for it) and
    publishes the new counts."""
    instance = dg.DagsterInstance.get()
    land(lake, "a", "1", [1, 2])
    land(lake, "b", "1", [1])
    run(capsys, "ab")
    assert rows_of(lake, "gold.ab") == [{"a_rows": 2, "b_rows": 1}]
    gold_snap = lake.tables().snapshot_id("gold.ab")
    assert len(materializations(instance, GOLD)) == 1

    out = run(capsys, "ab")
    assert "identical to main" in out, out
    assert lake.tables().snapshot_id("gold.ab") == gold_snap  # nothing published
    assert len(materializations(instance, GOLD)) == 1
    obs = observations(instance, GOLD)
    assert len(obs) == 1 and f"nothing new since snapshot {gold_snap}: identical to main" in obs[0].description
    assert not [r for r in lake.pyiceberg_catalog().load_table("gold.ab").metadata.refs if r.startswith("audit_")]

    land(lake, "b", "2", [2, 3])  # only b changes
    out = run(capsys, "ab")
    assert rows_of(lake, "gold.ab") == [{"a_rows": 2, "b_rows": 3}], out
    assert len(materializations(instance, GOLD)) == 2
    assert len(materializations(instance, B)) == 3


@pytest.mark.slow
def test_the_partitions_a_run_wrote_are_materialized_then_the_backfilled_ones_again(platform, tmp_path, monkeypatch):
    """A time-partitioned gold (daily, Spark): `lakehouse run` records one materialization per day it
    wrote (the Partitions tab shows every day as there), no unpartitioned one; `lakehouse backfill` of
    three days records a newer materialization for exactly those three."""
    # its own Dagster instance: tests/test_incremental.py materializes the same asset key in this worker
    (tmp_path / "dagster_home").mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    from lakehouse.stage.runner import StageRunner
    from tests.test_incremental import CLICKS

    landing = platform.settings.landing_dir / "clicks"
    landing.mkdir(parents=True)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "clicks.yaml").write_text(CLICKS)
    platform.store.apply(load_metadata(tmp_path / "m"))

    def land(name: str, clicks: list[tuple[str, int]]) -> None:
        (landing / name).write_text("".join(json.dumps({"ts": t, "amount": a}) + "\n" for t, a in clicks))

    days = [f"2026-11-0{d}" for d in range(1, 7)]
    land("a.jsonl", [(f"{d} 0{h}:00:00", 1) for d in days for h in (1, 2)])
    assert cli(["run", "clicks"]) == 0
    instance = dg.DagsterInstance.get()
    key = dg.AssetKey(["gold", "daily_clicks"])
    assert instance.get_materialized_partitions(key) == set(days)
    records = materializations(instance, key)
    assert sorted(r.asset_materialization.partition for r in records) == days  # one per day, none unpartitioned
    newest = {r.asset_materialization.partition: r.storage_id for r in records}

    land("b.jsonl", [(f"2026-11-0{d} 05:00:00", 10) for d in (2, 3, 4, 5)])
    r = StageRunner(platform, "clicks", "ingest")
    assert r.load(r.extract()).published
    assert cli(["backfill", "clicks", "--from", "2026-11-02", "--to", "2026-11-04"]) == 0
    after = {}
    for rec in materializations(instance, key):
        p = rec.asset_materialization.partition
        after[p] = max(after.get(p, 0), rec.storage_id)
    assert sorted(p for p in days if after[p] > newest[p]) == ["2026-11-02", "2026-11-03", "2026-11-04"]
