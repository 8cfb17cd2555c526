"""What the static checks (issue 17) add to `metadata validate` / `apply`, side by side.

Generates metadata with N chained SQL stages (each a join of the previous stage with a shared
dimension, plus rules on the output columns) and times `load_metadata` with the static checks
(`lakehouse.metadata.checks`: column derivation with sqlglot qualify + annotate_types, rule and key
checks) against the same load with them switched off (the baseline: parsing, the model, references).

    .venv/bin/python bench/bench_static_checks.py [--stages 50 200 800] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from unittest import mock

import yaml


def metadata(n: int) -> dict:
    cols = [{"name": "id", "type": "bigint"}, {"name": "k", "type": "bigint"}, {"name": "v", "type": "string"},
            {"name": "amount", "type": "double"}]
    md: dict = {
        "pipelines": [{"pipeline_id": "p"}],
        "sources": [{"source_id": "raw", "kind": "files", "format": "jsonl", "path": "raw", "columns": cols},
                    {"source_id": "dim_raw", "kind": "files", "format": "jsonl", "path": "dim",
                     "columns": [{"name": "k", "type": "bigint"}, {"name": "label", "type": "string"}]}],
        "targets": [{"target_id": "b0", "namespace": "bronze", "table": "t0"},
                    {"target_id": "dim", "namespace": "bronze", "table": "dim"}],
        "stages": [{"pipeline_id": "p", "stage_order": 1, "stage_name": "s0", "layer": "bronze", "source_id": "raw",
                    "target_id": "b0"},
                   {"pipeline_id": "p", "stage_order": 2, "stage_name": "dim", "layer": "bronze",
                    "source_id": "dim_raw", "target_id": "dim"}],
        "validation_rules": [{"rule_set_id": "rs", "rules": [
            {"name": "id_present", "type": "not_null", "columns": ["id"]},
            {"name": "amount_ok", "type": "range", "column": "amount", "min": 0},
            {"name": "label_known", "type": "expression", "expression": "label IS NOT NULL AND length(label) > 0"}]}],
    }
    prev = "bronze.t0"
    for i in range(1, n + 1):
        md["targets"].append({"target_id": f"s{i}", "namespace": "silver", "table": f"t{i}", "write_mode": "merge",
                              "merge_keys": ["id"], "partition_spec": [{"column": "k", "transform": "bucket",
                                                                        "param": 4}]})
        md["stages"].append({
            "pipeline_id": "p", "stage_order": i + 2, "stage_name": f"s{i}", "layer": "silver", "target_id": f"s{i}",
            "validation_set_id": "rs",
            "transformation": f"SELECT a.id, a.k, upper(a.v) AS v, a.amount * 1.0 AS amount, d.label "
                              f"FROM {prev} a LEFT JOIN bronze.dim d ON a.k = d.k WHERE a.id IS NOT NULL"})
        prev = f"silver.t{i}"
    return md


def timed(path: Path, checks: bool, repeat: int) -> float:
    """Best of `repeat` cold loads (the per-text parse caches are emptied before each)."""
    from lakehouse.metadata import checks as checks_module
    from lakehouse.metadata.loader import load_metadata
    from lakehouse.sql.parse import _query_or_error

    best = float("inf")
    for _ in range(repeat):
        _query_or_error.cache_clear()
        checks_module._expression_columns.cache_clear()
        if checks:
            t0 = time.perf_counter()
            load_metadata(path)
            best = min(best, time.perf_counter() - t0)
        else:
            with mock.patch("lakehouse.metadata.checks.check_stages", return_value=[]):
                t0 = time.perf_counter()
                load_metadata(path)
                best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, nargs="+", default=[50, 200, 800])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:  # imports (sqlglot's optimizer, pydantic) outside the timings
        warm = Path(d) / "warm.yaml"
        warm.write_text(yaml.safe_dump(metadata(2)))
        timed(warm, True, 1)
    print(f"{'stages':>7} {'baseline s':>11} {'with checks s':>14} {'ratio':>6} {'ms/stage added':>15}")
    with tempfile.TemporaryDirectory() as d:
        for n in args.stages:
            path = Path(d) / f"m{n}.yaml"
            path.write_text(yaml.safe_dump(metadata(n)))
            base = timed(path, False, args.repeat)
            full = timed(path, True, args.repeat)
            print(f"{n:>7} {base:>11.3f} {full:>14.3f} {full / base:>6.2f} {(full - base) * 1000 / n:>15.2f}")


if __name__ == "__main__":
    main()
