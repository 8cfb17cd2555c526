"""A files source written straight into a `write_mode: merge` target on Spark. The file lineage
column `_source_file` comes from Spark's hidden `_metadata.file_path`, not the nondeterministic
`input_file_name()`, which Spark refuses inside a MERGE (INVALID_NON_DETERMINISTIC_EXPRESSIONS).
Two landings with overlapping keys: the table equals the rows computed here independently (the
later file's row wins per key), read back with PyIceberg; `_source_file` keeps its spelling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakehouse.control import faults
from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.runner import StageRunner

pytestmark = pytest.mark.slow

META = """
pipelines:
  - {{pipeline_id: p}}
sources:
  - {{source_id: raw, kind: files, format: {fmt}, path: in, glob: "*.{fmt}", batch_files: 50}}
targets:
  - {{target_id: t, namespace: m_{ns}, table: events, engine: spark, write_mode: merge, merge_keys: [id]}}
stages:
  - {{pipeline_id: p, stage_order: 1, stage_name: ingest, layer: bronze, source_id: raw, target_id: t}}
"""


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()
    yield
    faults.reset()


def _land(root: Path, name: str, fmt: str, rows: list[dict]) -> Path:
    path = root / name
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text("id,amount\n" + "".join(f"{r['id']},{r['amount']}\n" for r in rows))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_files_source_merges_into_its_target_on_spark(platform, tmp_path, unique_ns, fmt):
    meta = tmp_path / "meta.yaml"
    meta.write_text(META.format(fmt=fmt, ns=unique_ns))
    platform.store.apply(load_metadata(meta))
    root = platform.settings.landing_dir / "in"
    root.mkdir(parents=True, exist_ok=True)
    ident = f"m_{unique_ns}.events"

    landings = [("a", [{"id": f"k{i}", "amount": float(i)} for i in range(1, 6)]),
                ("b", [{"id": f"k{i}", "amount": 100.0 + i} for i in range(4, 9)])]
    expected: dict[str, tuple[float, str]] = {}
    for stem, rows in landings:
        path = _land(root, f"{stem}.{fmt}", fmt, rows)
        runner = StageRunner(platform, "p", "ingest")
        outcome = runner.load(runner.extract())
        assert outcome.published
        for r in rows:  # the independent computation: the later file's row wins per key
            expected[r["id"]] = (float(r["amount"]), path.resolve().as_uri())

        table = platform.pyiceberg_catalog().load_table(ident)
        got = table.scan(selected_fields=("id", "amount", "_source_file")).to_arrow().to_pylist()
        assert len(got) == len(expected)  # each key once
        assert {r["id"]: (float(r["amount"]), r["_source_file"]) for r in got} == expected
        assert set(table.metadata.refs) == {"main"}
