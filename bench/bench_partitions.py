"""Seed 003's partition comparison on generated workflow-log data, through the platform's own DDL.

Three strategies for the same rows (partition spec and sort order from `Target` metadata):
  wf_month         identity(atlan_argo_workflow_name) + identity(month)   (seed 003's winner)
  wf_bucket        bucket(16, atlan_argo_workflow_name)
  wf_bucket_month  bucket(16, atlan_argo_workflow_name) + identity(month)
all sorted by timestamp DESC. The typical P0 query is "one workflow, one month": we report data
files planned by Iceberg scan planning (PyIceberg plan_files with the filter), and the median
time of the query in Spark and in PyIceberg, with ratios against wf_month.

    .venv/bin/python bench/bench_partitions.py                 # 300k rows, 40 workflows, 12 months
    .venv/bin/python bench/bench_partitions.py --rows 3000000  # bigger
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STRATEGIES = {
    "wf_month": [{"column": "atlan_argo_workflow_name"}, {"column": "month"}],
    "wf_bucket": [{"column": "atlan_argo_workflow_name", "transform": "bucket", "param": 16}],
    "wf_bucket_month": [{"column": "atlan_argo_workflow_name", "transform": "bucket", "param": 16},
                        {"column": "month"}],
}


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--workflows", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench_partitions_"))
    os.environ.update({"LAKEHOUSE_HOME": str(tmp)})
    os.environ.setdefault("LAKEHOUSE_SPARK_MASTER", "local[2]")
    os.environ.setdefault("LAKEHOUSE_SHUFFLE_PARTITIONS", "4")
    from pyiceberg.expressions import And, EqualTo
    from pyspark.sql import functions as F

    from lakehouse.metadata.model import Target
    from lakehouse.runtime.spark import get_spark
    from lakehouse.settings import load_settings
    from lakehouse.table.iceberg import IcebergTables

    settings = load_settings()
    spark = get_spark(settings, "bench-partitions")
    tables = IcebergTables(spark, settings.catalog_name)
    n, w = args.rows, args.workflows
    # a year of logs: timestamps ascend with id, workflows interleave, nested `extra` promoted to top level
    year_s = 365 * 86400
    df = (spark.range(n)
          .withColumn("timestamp", (F.lit(1735689600) + F.col("id") * F.lit(year_s // n)).cast("double"))
          .withColumn("atlan_argo_workflow_name", F.concat(F.lit("wf_"), (F.col("id") * 7919 % w).cast("string")))
          .withColumn("month", F.month(F.timestamp_seconds(F.col("timestamp"))).cast("bigint"))
          .withColumn("level", F.element_at(F.array(F.lit("INFO"), F.lit("WARNING"), F.lit("ERROR")),
                                            (F.col("id") % 3 + 1).cast("int")))
          .withColumn("message", F.concat(F.lit("step "), F.col("id").cast("string")))
          .withColumn("trace_id", F.sha1(F.col("id").cast("string")))
          .drop("id")).cache()
    df.count()
    wf, month = "wf_7", 6
    targets, write_s = {}, {}
    for name, spec in STRATEGIES.items():  # all Spark catalog writes first (SQLite allows one writer)
        t = Target(target_id=name, namespace="bench_logs", table=name, partition_spec=spec,
                   sort_order=[{"column": "timestamp", "direction": "desc"}])
        tables.ensure_table(t, df.schema, wap=False)
        t0 = time.perf_counter()
        tables.write(df, t)
        write_s[name] = time.perf_counter() - t0
        targets[name] = t
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse)
    results = {}
    for name, t in targets.items():
        table = cat.load_table(t.identifier)
        flt = And(EqualTo("atlan_argo_workflow_name", wf), EqualTo("month", month))
        planned = list(table.scan(row_filter=flt).plan_files())
        total = list(table.scan().plan_files())
        q = (f"SELECT count(*) AS n, max(timestamp) AS latest FROM {tables.qualified(t.identifier)} "
             f"WHERE atlan_argo_workflow_name = '{wf}' AND month = {month}")
        rows = spark.sql(q).collect()[0]["n"]
        spark_s = median_time(lambda q=q: spark.sql(q).collect(), args.repeat)
        py_s = median_time(lambda table=table, flt=flt: table.scan(row_filter=flt).to_arrow(), args.repeat)
        results[name] = {"files": len(planned), "total_files": len(total), "rows": rows,
                         "bytes": sum(f.file.file_size_in_bytes for f in planned), "spark_s": spark_s,
                         "pyiceberg_s": py_s, "write_s": write_s[name]}
    base = results["wf_month"]
    print(f"\n{n:,} rows, {w} workflows, 12 months; query: one workflow ({wf}), one month ({month})")
    print(f"{'strategy':<17}{'files scanned':>15}{'of total':>10}{'MB read':>9}{'spark ms':>10}{'x':>6}"
          f"{'pyiceberg ms':>14}{'x':>6}{'rows':>7}")
    for name, r in results.items():
        print(f"{name:<17}{r['files']:>15}{r['total_files']:>10}{r['bytes'] / 1e6:>9.2f}{r['spark_s'] * 1000:>10.1f}"
              f"{r['spark_s'] / base['spark_s']:>6.2f}{r['pyiceberg_s'] * 1000:>14.1f}"
              f"{r['pyiceberg_s'] / base['pyiceberg_s']:>6.2f}{r['rows']:>7}")
    assert len({r["rows"] for r in results.values()}) == 1, "every strategy must return the same rows"
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
