"""The checkpoint table: in sync with the snapshot summaries, incremental (only snapshots newer than
its mark are read), rebuildable, and shown by the CLI. Local landing files, real Spark + Iceberg."""

from __future__ import annotations

import json

import pytest

import lakehouse.ingest.checkpoints as ck
from lakehouse.cli import main as cli_main
from lakehouse.ingest.checkpoints import Checkpoints
from lakehouse.metadata.loader import load_metadata
from lakehouse.sources.arrivals import poll_arrivals
from lakehouse.stage.runner import StageRunner

META = """
pipelines:
  - {{pipeline_id: events}}
sources:
  - {{source_id: events_files, kind: files, format: jsonl, path: events, glob: "*.jsonl", batch_files: 1,
     max_files_per_run: 2}}
targets:
  - {{target_id: bronze_events, namespace: b_{ns}, table: events}}
stages:
  - {{pipeline_id: events, stage_order: 1, stage_name: ingest, layer: bronze, source_id: events_files,
     target_id: bronze_events}}
"""


@pytest.fixture
def events(platform, tmp_path, unique_ns):
    f = tmp_path / "events.yaml"
    f.write_text(META.format(ns=unique_ns))
    platform.store.apply(load_metadata(f))
    landing = platform.settings.landing_dir / "events"
    landing.mkdir(parents=True)
    return platform, landing, f"b_{unique_ns}.events"


def land(landing, name: str, n: int = 2) -> None:
    (landing / name).write_text("".join(json.dumps({"id": f"{name}-{i}", "v": i}) + "\n" for i in range(n)))


def run(platform):
    r = StageRunner(platform, "events", "ingest")
    plan = r.extract()
    return plan, r.load(plan)


def test_checkpoint_table_incremental_sync_rebuild_and_cli(events, monkeypatch, capsys):
    platform, landing, ident = events
    for i in range(3):
        land(landing, f"e{i}.jsonl")
    # the landing directory sensor: same semantics as S3 (batches by max_files_per_run, run keys)
    first = poll_arrivals(platform, "events", "ingest", None)
    assert [[f.key for f in b.files] for b in first.batches] == [["e0.jsonl", "e1.jsonl"], ["e2.jsonl"]]
    assert poll_arrivals(platform, "events", "ingest", first.cursor).skip_reason

    plan, out = run(platform)  # max_files_per_run 2: two files, one commit each (batch_files 1)
    assert plan.details["files_planned"] == 2 and len(out.writes) == 2
    plan, out = run(platform)
    assert plan.details["files_planned"] == 1 and out.rows_written == 2
    cp = Checkpoints(platform, ident)
    rows = cp.rows()
    assert sorted(r["file_key"] for r in rows) == ["e0.jsonl", "e1.jsonl", "e2.jsonl"]
    assert len({r["snapshot_id"] for r in rows}) == 3  # one commit per file
    main = platform.tables().snapshot_id(ident)
    assert cp.mark()[0] == main

    # a rerun with the table in sync reads no snapshot metadata at all
    calls = []
    real = ck._snapshot_rows

    def spy(tables, identifier, since_ms):
        out = real(tables, identifier, since_ms)
        calls.append((since_ms, len(out)))
        return out

    monkeypatch.setattr(ck, "_snapshot_rows", spy)
    plan, out = run(platform)
    assert plan.skipped_reason and calls == []
    # a new file: the folds read only snapshots from the mark on, never the whole history
    land(landing, "e3.jsonl")
    plan, out = run(platform)
    assert out.rows_written == 2
    assert calls and all(since is not None for since, _ in calls)
    assert all(n <= 2 for _, n in calls)  # the mark's snapshot and the new one
    monkeypatch.setattr(ck, "_snapshot_rows", real)

    # the table is derived data: wipe and rebuild from the summaries
    before = {(r["file_key"], r["etag"], r["snapshot_id"], r["run_id"]) for r in cp.rows()}
    assert cp.rebuild(platform.tables()) == 4
    assert {(r["file_key"], r["etag"], r["snapshot_id"], r["run_id"]) for r in cp.rows()} == before

    assert cli_main(["checkpoints", "show", ident]) == 0
    shown = capsys.readouterr().out
    assert "e3.jsonl" in shown and "{'processed': 4}" in shown
    assert cli_main(["checkpoints", "show", "nope.missing"]) == 2
    assert "no Iceberg table 'nope.missing'" in capsys.readouterr().err


@pytest.mark.parametrize("lineage", [True, False])
def test_lineage_columns_are_per_source(platform, tmp_path, unique_ns, lineage):
    """`lineage_columns: false` writes the files' own columns only; checkpoints work the same."""
    ns = f"{unique_ns}{int(lineage)}"
    f = tmp_path / "events.yaml"
    f.write_text(META.format(ns=ns).replace("max_files_per_run: 2}", f"max_files_per_run: 2, lineage_columns: {str(lineage).lower()}}}"))
    platform.store.apply(load_metadata(f))
    landing = platform.settings.landing_dir / "events"
    landing.mkdir(parents=True)
    name = "only.jsonl"
    land(landing, name, n=3)
    r = StageRunner(platform, "events", "ingest")
    r.load(r.extract())
    table = platform.pyiceberg_catalog().load_table(f"b_{ns}.events").scan().to_arrow()
    assert table.num_rows == 3
    if lineage:
        assert set(table.column_names) == {"id", "v", "_source_file", "_ingested_at"}
        assert set(table.column("_source_file").to_pylist()) == {(landing / name).resolve().as_uri()}
    else:
        assert set(table.column_names) == {"id", "v"}
    assert [row["file_key"] for row in Checkpoints(platform, f"b_{ns}.events").rows()] == [name]


def test_a_landing_larger_than_batch_bytes_commits_and_checkpoints_per_batch(platform, tmp_path, unique_ns):
    """Batches are bounded by bytes as well as files: five equal files with room for two per
    `batch_bytes` are three commits, each with its own files' checkpoints."""
    landing = platform.settings.landing_dir / "sized"
    landing.mkdir(parents=True)
    for i in range(5):
        (landing / f"s{i}.jsonl").write_text(
            "".join(json.dumps({"id": f"s{i}-{j:05d}", "v": j % 10}) + "\n" for j in range(40)))
    size = (landing / "s0.jsonl").stat().st_size
    assert {(landing / f"s{i}.jsonl").stat().st_size for i in range(5)} == {size}
    f = tmp_path / "sized.yaml"
    f.write_text(META.format(ns=unique_ns).replace("path: events", "path: sized")
                 .replace("batch_files: 1,", f"batch_bytes: {2 * size + size // 2},")
                 .replace("max_files_per_run: 2", "max_files_per_run: 10"))
    platform.store.apply(load_metadata(f))
    plan, out = run(platform)
    assert plan.details["files_planned"] == 5 and len(out.writes) == 3 and out.rows_written == 200
    rows = Checkpoints(platform, f"b_{unique_ns}.events").rows()
    by_snapshot: dict[int, list[str]] = {}
    for r in rows:
        by_snapshot.setdefault(r["snapshot_id"], []).append(r["file_key"])
    assert sorted(sorted(v) for v in by_snapshot.values()) == [["s0.jsonl", "s1.jsonl"], ["s2.jsonl", "s3.jsonl"],
                                                               ["s4.jsonl"]]
