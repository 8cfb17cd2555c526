"""Self-healing through real runs: one injected fault per built-in error → resolution pair.

Each test runs a small pipeline with Dagster's `execute_in_process` on real Spark + Iceberg, with
a fault switched on through LAKEHOUSE_FAULTS (or a real damaged file / a real failing endpoint),
and asserts that the run ends healed, the data is right, and the audit trail says what happened.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.control import faults
from lakehouse.metadata.loader import load_metadata
from lakehouse_assets.definitions import build_definitions, pipeline_job


@pytest.fixture(autouse=True)
def _reset_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.delenv("LAKEHOUSE_HEALING_MAX_ATTEMPTS", raising=False)
    faults.reset()
    yield
    faults.reset()


def apply_yaml(platform, tmp_path: Path, text: str) -> None:
    f = tmp_path / f"meta_{abs(hash(text)) % 10**8}.yaml"
    f.write_text(text)
    platform.store.apply(load_metadata(f))


def run_job(platform, pipeline_id: str):
    job = pipeline_job(build_definitions(platform), pipeline_id)
    return job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def pyiceberg(settings) -> SqlCatalog:
    return SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, compression="snappy")


def audit(platform, run_id: str, event: str | None = None):
    return platform.store.audit_entries(run_id=run_id, event=event)


def actions_taken(platform, run_id: str) -> list[tuple[str, str]]:
    return [(e.action, e.outcome) for e in audit(platform, run_id, "healing_action")]


def materialization_md(result, key: str) -> dict:
    mats = {e.asset_key.to_user_string(): e for e in result.get_asset_materialization_events()}
    return {k: v.value for k, v in mats[key].materialization.metadata.items()}


def files_pipeline(pid: str, *, fmt: str = "jsonl", batch_files: int = 10, healing: str = "",
                   extra_sources: str = "", alt: str = "", rules: str = "") -> str:
    return f"""
pipelines:
  - {{pipeline_id: {pid}}}
sources:
  - {{source_id: {pid}_raw, kind: files, format: {fmt}, path: {pid}, glob: "*.{fmt}", batch_files: {batch_files}{alt}}}
{extra_sources}
targets:
  - {{target_id: {pid}_bronze, namespace: bronze, table: {pid}, write_mode: append}}
stages:
  - {{pipeline_id: {pid}, stage_order: 1, stage_name: ingest, layer: bronze, source_id: {pid}_raw,
     target_id: {pid}_bronze{", validation_set_id: " + pid + "_rules" if rules else ""}}}
{rules}
healing_actions:
{healing}
"""


# --------------------------------------------------------------------------- commit conflict


def test_commit_conflict_is_refreshed_and_recommitted(platform, tmp_path, monkeypatch):
    land = platform.settings.landing_dir / "cc"
    write_jsonl(land / "a.jsonl", [{"id": i, "v": f"x{i}"} for i in range(20)])
    apply_yaml(platform, tmp_path, files_pipeline("cc", healing="""
  - {healing_id: commit_conflict, error_code: ICEBERG_COMMIT_CONFLICT, actions: [refresh_and_recommit],
     max_attempts: 3}
"""))
    monkeypatch.setenv(faults.ENV, "commit_conflict:times=1")
    result = run_job(platform, "cc")
    assert result.success

    table = pyiceberg(platform.settings).load_table("bronze.cc")
    assert table.scan().to_arrow().num_rows == 20
    # the concurrent (empty) commit to main survived: our snapshot was cherry-picked on top of it
    ops = [s.summary.operation.value for s in table.snapshots()]
    assert len(table.snapshots()) >= 3, ops
    assert table.current_snapshot().summary.additional_properties.get("added-records") == "20"

    run_id = result.run_id
    failed = audit(platform, run_id, "step_failed")
    assert [json.loads(json.dumps(e.details))["code"] for e in failed] == ["ICEBERG_COMMIT_CONFLICT"]
    assert failed[0].error_class == "org.apache.iceberg.exceptions.CommitFailedException"
    assert failed[0].details["step"] == "publish"
    assert actions_taken(platform, run_id) == [("refresh_and_recommit", "applied")]
    healed = audit(platform, run_id, "healing")
    assert [(e.outcome, e.details["step"]) for e in healed] == [("healed", "publish")]
    md = materialization_md(result, "bronze/cc")
    assert md["healing_attempts"] == 1
    assert [e.get("action") for e in md["healing"] if e.get("action")] == ["refresh_and_recommit"]


# --------------------------------------------------------------------------- schema drift


def sql_drift_pipeline(pid: str, silver_props: str = "") -> str:
    """bronze from files (reconciled per file, never a drift error) and an appending SQL stage whose
    output gains every new bronze column: the write error evolve_schema heals."""
    return f"""
pipelines:
  - {{pipeline_id: {pid}}}
sources:
  - {{source_id: {pid}_raw, kind: files, format: jsonl, path: {pid}, glob: "*.jsonl", batch_files: 1,
     lineage_columns: false}}
targets:
  - {{target_id: {pid}_bronze, namespace: bronze, table: {pid}, write_mode: append}}
  - {{target_id: {pid}_silver, namespace: silver, table: {pid}, write_mode: append{silver_props}}}
stages:
  - {{pipeline_id: {pid}, stage_order: 1, stage_name: ingest, layer: bronze, source_id: {pid}_raw,
     target_id: {pid}_bronze}}
  - {{pipeline_id: {pid}, stage_order: 2, stage_name: copy, layer: silver, target_id: {pid}_silver,
     transformation: "SELECT * FROM bronze.{pid} WHERE id >= 100 OR id < 5"}}
healing_actions:
  - {{healing_id: drift, error_code: SCHEMA_DRIFT, actions: [evolve_schema], max_attempts: 2}}
"""


def test_new_input_column_evolves_the_table(platform, tmp_path):
    land = platform.settings.landing_dir / "sd"
    write_jsonl(land / "a.jsonl", [{"id": i, "v": f"x{i}"} for i in range(5)])
    apply_yaml(platform, tmp_path, sql_drift_pipeline("sd"))
    assert run_job(platform, "sd").success
    write_jsonl(land / "b.jsonl", [{"id": 100 + i, "v": f"y{i}", "extra": i * 1.5} for i in range(4)])
    result = run_job(platform, "sd")
    assert result.success

    # the files source reconciled b.jsonl on its own before the write: the column was added, nothing failed
    rows = pyiceberg(platform.settings).load_table("bronze.sd").scan().to_arrow().to_pylist()
    assert len(rows) == 9
    assert sorted(r["extra"] for r in rows if r["id"] >= 100) == [0.0, 1.5, 3.0, 4.5]
    assert all(r["extra"] is None for r in rows if r["id"] < 100)
    assert [e.stage_name for e in audit(platform, result.run_id, "schema_evolved")] == ["ingest"]
    # the SQL stage's output gained the column: its write failed and evolve_schema healed it
    rows = pyiceberg(platform.settings).load_table("silver.sd").scan().to_arrow().to_pylist()
    assert sorted(r["extra"] for r in rows if r["id"] >= 100) == [0.0, 1.5, 3.0, 4.5]
    run_id = result.run_id
    [failed] = audit(platform, run_id, "step_failed")
    assert failed.details["code"] == "SCHEMA_DRIFT" and failed.details["step"] == "load"
    assert failed.stage_name == "copy"
    [act] = audit(platform, run_id, "healing_action")
    assert (act.action, act.outcome, act.details["added_columns"]) == ("evolve_schema", "applied", ["extra"])
    assert materialization_md(result, "silver/sd")["rows_written"] == 9  # nothing written twice


def test_schema_drift_is_not_healed_when_the_policy_freezes_the_schema(platform, tmp_path):
    land = platform.settings.landing_dir / "sf"
    write_jsonl(land / "a.jsonl", [{"id": 1, "v": "a"}])
    text = sql_drift_pipeline("sf", silver_props=", table_properties: {lakehouse.schema_policy: freeze}")
    apply_yaml(platform, tmp_path, text)
    assert run_job(platform, "sf").success
    write_jsonl(land / "b.jsonl", [{"id": 2, "v": "b", "extra": 1.0}])
    result = run_job(platform, "sf")
    assert not result.success
    [act] = audit(platform, result.run_id, "healing_action")
    assert act.outcome == "not_applicable" and "freeze" in act.details["detail"]
    assert [e.outcome for e in audit(platform, result.run_id, "healing")] == ["unhealed"]
    cols = [f.name for f in pyiceberg(platform.settings).load_table("silver.sf").schema().fields]
    assert "extra" not in cols


def test_a_files_source_under_freeze_quarantines_a_file_with_new_columns(platform, tmp_path):
    land = platform.settings.landing_dir / "sq"
    write_jsonl(land / "a.jsonl", [{"id": 1, "v": "a"}])
    text = files_pipeline("sq", batch_files=1, healing="""
  - {healing_id: corrupt, error_code: CORRUPT_INPUT, actions: [quarantine_input]}
""").replace(
        "write_mode: append}", "write_mode: append, table_properties: {lakehouse.schema_policy: freeze}}")
    apply_yaml(platform, tmp_path, text)
    assert run_job(platform, "sq").success
    write_jsonl(land / "b.jsonl", [{"id": 2, "v": "b", "extra": 1.0}])
    write_jsonl(land / "c.jsonl", [{"id": 3, "v": "c"}])
    result = run_job(platform, "sq")
    assert result.success  # the file that does not fit is set aside; the rest loads
    md = materialization_md(result, "bronze/sq")
    assert json.loads(md["quarantined_file_errors"]) == [
        {"key": "b.jsonl", "error": "new column extra (double) (schema policy freeze)"}]
    table = pyiceberg(platform.settings).load_table("bronze.sq")
    assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == [1, 3]
    assert "extra" not in [f.name for f in table.schema().fields]


# --------------------------------------------------------------------------- corrupt input


def test_corrupt_parquet_file_is_quarantined_and_the_rest_loads(platform, tmp_path):
    land = platform.settings.landing_dir / "cp"
    write_parquet(land / "a.parquet", [{"id": i, "v": f"a{i}"} for i in range(50)])
    write_parquet(land / "b.parquet", [{"id": 100 + i, "v": f"b{i}" * 20} for i in range(200)])
    write_parquet(land / "c.parquet", [{"id": 1000 + i, "v": f"c{i}"} for i in range(30)])
    # damage b's data pages but keep its footer: the cheap pre-read probe (footer) passes,
    # Spark fails while decoding the pages — a truncated/overwritten column chunk
    bad = land / "b.parquet"
    raw = bytearray(bad.read_bytes())
    footer_len = int.from_bytes(raw[-8:-4], "little") + 8
    for i in range(8, len(raw) - footer_len - 8):
        raw[i] = 0xFF
    bad.write_bytes(bytes(raw))
    pq.read_metadata(bad)  # the footer is intact

    apply_yaml(platform, tmp_path, files_pipeline("cp", fmt="parquet", healing="""
  - {healing_id: corrupt, error_code: CORRUPT_INPUT, actions: [quarantine_input], max_attempts: 3}
"""))
    result = run_job(platform, "cp")
    assert result.success, [(e.event, e.outcome, e.details, (e.message or "")[:300])
                            for e in audit(platform, result.run_id)]

    ids = sorted(r["id"] for r in pyiceberg(platform.settings).load_table("bronze.cp").scan().to_arrow().to_pylist())
    assert ids == list(range(50)) + list(range(1000, 1030))
    run_id = result.run_id
    # the batch's read finds the file itself (lakehouse.engines.isolate): the step never fails, so
    # the CORRUPT_INPUT rule has nothing left to heal (it matches the error: tests/test_unreadable_files.py)
    assert not audit(platform, run_id, "step_failed")
    [quarantined] = audit(platform, run_id, "file_quarantined")
    assert quarantined.details["key"] == "b.parquet" and "unreadable" in quarantined.message
    copy = platform.settings.home / "quarantine" / "files" / "cp" / "ingest" / "b.parquet"
    assert copy.read_bytes() == bad.read_bytes()  # set aside intact, landing untouched
    assert bad.exists()
    md = materialization_md(result, "bronze/cp")
    assert md["quarantined_files"] == 1 and md["files_quarantined"] == 1

    # the next run does not pick the quarantined file up again (nor reload a or c)
    again = run_job(platform, "cp")
    assert again.success
    assert not audit(platform, again.run_id, "step_failed")
    assert pyiceberg(platform.settings).load_table("bronze.cp").scan().to_arrow().num_rows == 80


# --------------------------------------------------------------------------- memory pressure


def test_out_of_memory_on_a_large_batch_shrinks_the_batch(platform, tmp_path, monkeypatch):
    land = platform.settings.landing_dir / "om"
    for f in range(4):
        write_jsonl(land / f"f{f}.jsonl", [{"id": f * 100 + i, "v": "x"} for i in range(50)])
    apply_yaml(platform, tmp_path, files_pipeline("om", batch_files=4, healing="""
  - {healing_id: oom, error_code: OUT_OF_MEMORY, actions: [shrink_batch], max_attempts: 3}
"""))
    monkeypatch.setenv(faults.ENV, "oom:rows_above=120")  # 4 files = 200 rows fail, 2 files = 100 pass
    result = run_job(platform, "om")
    assert result.success

    assert pyiceberg(platform.settings).load_table("bronze.om").scan().to_arrow().num_rows == 200
    run_id = result.run_id
    [failed] = audit(platform, run_id, "step_failed")
    assert failed.details["code"] == "OUT_OF_MEMORY" and "OutOfMemoryError" in failed.message
    [act] = audit(platform, run_id, "healing_action")
    assert (act.action, act.outcome, act.details["batch_files"]) == ("shrink_batch", "applied", 2)
    md = materialization_md(result, "bronze/om")
    assert md["commits"] == 2 and md["rows_written"] == 200 and md["batch_scale"] == 0.5


# --------------------------------------------------------------------------- source down


def test_source_down_fails_over_to_the_recovery_path(platform, tmp_path, monkeypatch):
    write_jsonl(platform.settings.landing_dir / "sdn" / "a.jsonl", [{"id": 1, "v": "primary"}])
    write_jsonl(platform.settings.landing_dir / "sdn_mirror" / "a.jsonl",
                [{"id": 1, "v": "mirror"}, {"id": 2, "v": "mirror"}])
    apply_yaml(platform, tmp_path, files_pipeline(
        "sdn", alt=", alternative_source_id: sdn_mirror",
        extra_sources='  - {source_id: sdn_mirror, kind: files, format: jsonl, path: sdn_mirror, glob: "*.jsonl"}',
        healing="""
  - {healing_id: down, error_code: SOURCE_UNAVAILABLE, actions: [switch_to_recovery_path], max_attempts: 2}
"""))
    monkeypatch.setenv(faults.ENV, "source_down:source=sdn_raw")
    result = run_job(platform, "sdn")
    assert result.success

    rows = pyiceberg(platform.settings).load_table("bronze.sdn").scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["v"]) for r in rows) == [(1, "mirror"), (2, "mirror")]
    run_id = result.run_id
    [failed] = audit(platform, run_id, "step_failed")
    assert failed.details["code"] == "SOURCE_UNAVAILABLE" and failed.details["step"] == "extract"
    [act] = audit(platform, run_id, "healing_action")
    assert (act.action, act.outcome, act.details["to"]) == ("switch_to_recovery_path", "applied", "sdn_mirror")
    md = materialization_md(result, "bronze/sdn")
    assert md["extract_healing_attempts"] == 1


# --------------------------------------------------------------------------- unmatched / bounds


def test_unmatched_error_fails_as_before(platform, tmp_path, monkeypatch):
    write_jsonl(platform.settings.landing_dir / "um" / "a.jsonl", [{"id": 1}])
    apply_yaml(platform, tmp_path, files_pipeline("um", healing="""
  - {healing_id: only_oom, error_code: OUT_OF_MEMORY, actions: [shrink_batch]}
"""))
    monkeypatch.setenv(faults.ENV, "fail:point=extract,message=boom unexpected")
    result = run_job(platform, "um")
    assert not result.success
    assert "boom unexpected" in str(result.get_step_failure_events()[0].event_specific_data.error)
    assert not audit(platform, result.run_id, "healing_action")
    [h] = audit(platform, result.run_id, "healing")
    assert h.outcome == "unhealed" and "no healing action matches" in h.details["reason"]


def test_rule_attempts_are_bounded(platform, tmp_path, monkeypatch):
    from lakehouse.stage.runner import StageRunner

    write_jsonl(platform.settings.landing_dir / "bd" / "a.jsonl", [{"id": 1}])
    apply_yaml(platform, tmp_path, files_pipeline("bd", healing="""
  - {healing_id: flaky, error_code: TRANSIENT_IO, actions: [retry_after_backoff], max_attempts: 3,
     backoff_seconds: 0}
"""))
    monkeypatch.setenv(faults.ENV, "fail:point=extract")  # fails forever
    runner = StageRunner(platform, "bd", "ingest", run_id="bounded-run")
    with pytest.raises(Exception, match="503"):
        runner.extract()
    assert len(audit(platform, "bounded-run", "step_failed")) == 3
    assert [a for a, _ in actions_taken(platform, "bounded-run")] == ["retry_after_backoff"] * 3
    [h] = audit(platform, "bounded-run", "healing")
    assert h.outcome == "unhealed" and "used all their attempts" in h.details["reason"]


def test_global_cap_bounds_healing_across_rules(platform, tmp_path, monkeypatch):
    from lakehouse.stage.runner import StageRunner

    write_jsonl(platform.settings.landing_dir / "gc" / "a.jsonl", [{"id": 1}])
    apply_yaml(platform, tmp_path, files_pipeline("gc", healing="""
  - {healing_id: first, error_code: TRANSIENT_IO, actions: [retry_after_backoff], max_attempts: 20,
     backoff_seconds: 0, priority: 1}
  - {healing_id: second, message_regex: "503", actions: [retry_after_backoff], max_attempts: 20,
     backoff_seconds: 0, priority: 2}
"""))
    monkeypatch.setenv(faults.ENV, "fail:point=extract")
    # LAKEHOUSE_HEALING_MAX_ATTEMPTS=4, as the entry point that builds the platform reads it
    capped = dataclasses.replace(platform, settings=platform.settings.model_copy(update={"healing_max_attempts": 4}))
    runner = StageRunner(capped, "gc", "ingest", run_id="capped-run")
    with pytest.raises(Exception, match="503"):
        runner.extract()
    failed = audit(platform, "capped-run", "step_failed")
    assert len(failed) == 4 and {e.action for e in failed} == {"first"}  # priority order
    [h] = audit(platform, "capped-run", "healing")
    assert h.outcome == "exhausted" and "global healing cap of 4" in h.details["reason"]
