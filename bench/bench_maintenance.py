"""Table maintenance after many small batches: file count and full-scan time before and after compaction.

    .venv/bin/python bench/bench_maintenance.py                   # 200 batches of 500 rows, 5 rounds
    .venv/bin/python bench/bench_maintenance.py --batches 200 --rows 2000 --rounds 7

One process, one SparkSession, an embedded SQLite catalog and control DB in a temp home. The table
gets `--batches` appends of `--rows` rows each (one small file per append, what an hourly or
per-arrival pipeline leaves behind), then `lakehouse.table.maintenance.maintain` runs as the metadata below
says (compaction due: more than 10 files under 32 MB). The snapshot from before compaction is kept
(snapshot_max_age_hours is the default 168), so both sides are scanned in the same process in
alternating rounds: the pre-compaction snapshot (time travel, the 200 small files) and main after
compaction. A full scan reads every column of every row (sums over them, so no aggregate is
answered from file statistics). Prints file counts, each round's times and the median ratio
before / after, for Spark and for PyIceberg (an independent reader).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

META = """
targets:
  - {target_id: bench_events, namespace: bench, table: events, write_mode: append}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rows", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bench_maint_"))
    os.environ.update({"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": "lake",
                       "LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
                       "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
                       "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}"})
    os.environ.setdefault("LAKEHOUSE_SPARK_MASTER", "local[2]")
    os.environ.setdefault("LAKEHOUSE_SHUFFLE_PARTITIONS", "2")
    from lakehouse.metadata.loader import load_metadata
    from lakehouse.stage.runner import Platform
    from lakehouse.table import maintenance

    (home / "meta.yaml").write_text(META)
    platform = Platform.from_env()
    platform.store.apply(load_metadata(home / "meta.yaml"))
    spark, tables = platform.spark(), platform.tables()
    ident = "bench.events"
    q = tables.qualified(ident)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {q.rsplit('.', 1)[0]}")
    spark.sql(f"CREATE TABLE {q} (id BIGINT, user_id BIGINT, kind STRING, amount DOUBLE, note STRING) USING iceberg")
    t0 = time.monotonic()
    for b in range(args.batches):
        spark.range(b * args.rows, (b + 1) * args.rows).selectExpr(
            "id", "id % 997 AS user_id", "CAST(id % 7 AS STRING) AS kind", "id * 0.5 AS amount",
            "concat('n', CAST(id AS STRING)) AS note").coalesce(1).writeTo(q).append()
    print(f"{args.batches} appends of {args.rows} rows: {time.monotonic() - t0:.1f} s")
    before_snap = tables.snapshot_id(ident)
    before = maintenance.table_state(tables, ident, 32 * maintenance.MB)

    res = maintenance.maintain(platform, platform.catalog().target("bench_events"))
    after = maintenance.table_state(tables, ident, 32 * maintenance.MB)
    print(f"maintain: {res['duration_ms'] / 1000:.1f} s, due {res['due']}; data files {before.data_files} -> "
          f"{after.data_files}, manifests {before.manifests} -> {after.manifests}, "
          f"bytes {before.data_bytes} -> {after.data_bytes}")

    sql = ("SELECT count(*), sum(id), sum(user_id), sum(length(kind)), sum(amount), sum(length(note)) FROM {src}")
    sides = {"before": f"{q} VERSION AS OF {int(before_snap)}", "after": q}
    meta_tbl = platform.pyiceberg_catalog().load_table(ident)
    times: dict[str, list[float]] = {f"{eng}_{s}": [] for eng in ("spark", "pyiceberg") for s in sides}
    results = {}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            t = time.monotonic()
            results[side] = spark.sql(sql.format(src=sides[side])).collect()[0]
            times[f"spark_{side}"].append(time.monotonic() - t)
            t = time.monotonic()
            snap = before_snap if side == "before" else None
            n = meta_tbl.scan(snapshot_id=snap).to_arrow().num_rows if snap else meta_tbl.refresh().scan().to_arrow().num_rows
            times[f"pyiceberg_{side}"].append(time.monotonic() - t)
            assert n == args.batches * args.rows, n
    assert results["before"] == results["after"], results  # same rows before and after compaction
    for k, v in times.items():
        print(f"{k:16s} " + " ".join(f"{x:.3f}" for x in v) + f"   median {statistics.median(v):.3f} s")
    for eng in ("spark", "pyiceberg"):
        ratio = statistics.median(times[f"{eng}_before"]) / statistics.median(times[f"{eng}_after"])
        print(f"{eng}: full scan before / after compaction = {ratio:.2f}x "
              f"({before.data_files} files -> {after.data_files})")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
