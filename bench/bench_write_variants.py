"""What the platform adds to a plain Iceberg append, one piece at a time, in one warm SparkSession.

    .venv/bin/python bench/bench_write_variants.py PARQUET_DIR [--rounds 2]

Variants, alternated each round on the same input (a fresh table each time):
  plain        read the parquet files, create the Iceberg table, append;
  lineage      plus `_source_file` (input_file_name()) and `_ingested_at` (current_timestamp());
  ingested_at  plus `_ingested_at` only;
  observe      plus a `DataFrame.observe` row count (how the audit's row rules ride on the write).
Prints seconds per variant and each variant's ratio to plain. bench/bench_ingest.py --keep leaves
an input to point it at.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="a folder of parquet files")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("LAKEHOUSE_HOME", tempfile.mkdtemp(prefix="bench_write_variants_"))

    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from lakehouse.runtime.spark import get_spark
    from lakehouse.settings import load_settings

    spark = get_spark(load_settings(), app_name="bench_write_variants")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS bench")
    variants = {
        "plain": lambda d: d,
        "lineage": lambda d: d.withColumn("_source_file", F.input_file_name())
                              .withColumn("_ingested_at", F.current_timestamp()),
        "ingested_at": lambda d: d.withColumn("_ingested_at", F.current_timestamp()),
        "observe": lambda d: d.observe(Observation(), F.count(F.lit(1)).alias("total")),
    }

    def run(build) -> float:
        spark.sql("DROP TABLE IF EXISTS bench.write_variants PURGE")
        t0 = time.monotonic()
        build(spark.read.parquet(args.input)).writeTo("bench.write_variants").using("iceberg").createOrReplace()
        return time.monotonic() - t0

    run(variants["plain"])  # warm-up: JIT, catalog tables
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            times[name].append(run(variants[name]))
    base = statistics.median(times["plain"])
    for name, ts in times.items():
        print(f"{name:12s} {', '.join(f'{t:.1f}s' for t in ts)} | median ratio to plain "
              f"{statistics.median(ts) / base:.3f}")


if __name__ == "__main__":
    main()
