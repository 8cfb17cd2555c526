"""Cost of the audit path: write-audit-publish with checks vs a direct append.

    .venv/bin/python bench/bench_wap.py                 # 1M rows, 3 rounds
    .venv/bin/python bench/bench_wap.py --rows 10000000 --configs stats,rules,regex --rounds 5

One process, one SparkSession, the same parquet input for both sides, fresh tables per round,
sides alternated so neither always runs on a warmer JVM:
  * direct: read the files, append to an Iceberg table's main (what a hand-written job does);
  * wap:    the write-audit-publish service (`lakehouse.stage.wap_service`) on the same frame: audit branch, the rule set
            below evaluated for the new rows, check history rows, kill-switch re-check,
            fast-forward publish, branch dropped.
Prints each timing and the median ratio wap / direct (goal <= 1.15) per rule set (`--configs`):
  * stats:  row count, not-null, range, freshness, row-count change: all answered from the new
            files' Iceberg statistics, nothing evaluated per row;
  * rules:  stats + accepted values and a SQL expression, counted on the rows as they are
            written (`DataFrame.observe`);
  * regex:  rules + a regex on every row (Java regex per row: its own cost, reported apart);
  * unique: rules + a `unique` rule (a full shuffle of the table, whose cost grows with the
            table, not with the audit path).
and, per rule, where its count came from (file statistics, observed on write, or the rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

RULES = """
validation_rules:
  - rule_set_id: bench_rules
    rules:
      - {name: not_empty, type: row_count, min: 1, severity: error}
      - {name: id_present, type: not_null, columns: [event_id, user_id], severity: error}
      - {name: amount_range, type: range, column: amount, min: 0, max: 100000, severity: error}
      - {name: fresh, type: freshness, column: event_ts, max_age_seconds: 315360000, severity: warn}
      - {name: growth, type: row_count_change, max_change_pct: 100000, severity: warn}
%s
"""
ROW_RULES = """
      - {name: known_type, type: accepted_values, column: event_type, values: [view, click, purchase, signup],
         severity: warn}
      - {name: sane, type: expression, expression: "amount >= 0 OR event_type <> 'purchase'", severity: warn}"""
EXTRA = {
    "stats": "",
    "rules": ROW_RULES,
    "regex": ROW_RULES + '\n      - {name: country_code, type: regex, column: country, pattern: "^[A-Z]{2}$", '
                         'severity: warn}',
    "unique": ROW_RULES + "\n      - {name: event_id_unique, type: unique, columns: [event_id], severity: error}",
}

META = """
pipelines:
  - {pipeline_id: bench_wap}
targets:
  - {target_id: bench_target, namespace: bench, table: events_wap, write_mode: append}
stages:
  - {pipeline_id: bench_wap, stage_order: 1, stage_name: load, layer: silver, target_id: bench_target,
     transformation: "SELECT CAST(NULL AS string) AS event_id, CAST(NULL AS bigint) AS user_id,
       CAST(NULL AS string) AS event_type, CAST(NULL AS double) AS amount, CAST(NULL AS string) AS country,
       CAST(NULL AS timestamp) AS event_ts", validation_set_id: bench_rules}
"""
# the stage's SQL is never run (the bench hands the service its frame): it names the input's columns
# so that the static checks of `metadata apply` (issue 17) accept the rules on them


def generate(spark, out: Path, rows: int, files: int) -> None:
    """Deterministic events written once with Spark (the input both sides read)."""
    from pyspark.sql import functions as F

    df = (spark.range(rows).repartition(files)
          .withColumn("event_id", F.concat(F.lit("e"), F.col("id").cast("string")))
          .withColumn("user_id", (F.col("id") % 50_000).cast("bigint"))
          .withColumn("event_type", F.element_at(F.array(*[F.lit(x) for x in ("view", "click", "purchase", "signup")]),
                                                 (F.col("id") % 4 + 1).cast("int")))
          .withColumn("amount", (F.col("id") % 1000).cast("double") / 10)
          .withColumn("country", F.element_at(F.array(*[F.lit(x) for x in ("DE", "FR", "US", "JP")]),
                                              (F.col("id") % 4 + 1).cast("int")))
          .withColumn("event_ts", F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")))
          .drop("id"))
    df.write.mode("overwrite").parquet(str(out))


def _instrument() -> dict[str, list[float]]:
    """Time the phases of the audit path (write to branch, audit, history, publish)."""
    from collections import defaultdict

    from lakehouse.engines.spark.write import SparkAuditedWrite as AuditedWrite
    from lakehouse.stage import wap_service
    from lakehouse.stage.wap_service import WriteAuditPublish

    phases: dict[str, list[float]] = defaultdict(list)

    def timed(cls, name, label):
        original = getattr(cls, name)

        def wrapper(*a, **kw):
            t0 = time.monotonic()
            try:
                return original(*a, **kw)
            finally:
                phases[label].append(time.monotonic() - t0)

        setattr(cls, name, wrapper)

    timed(AuditedWrite, "__init__", "init")
    timed(AuditedWrite, "write", "write_branch")
    timed(AuditedWrite, "audit", "audit")
    timed(AuditedWrite, "publish", "publish")
    timed(WriteAuditPublish, "record_checks", "history")
    timed(wap_service, "require_enabled", "kill_switch")
    return phases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default="stats,rules,regex,unique",
                    help="comma list of rule sets to measure: stats, rules (stats + row rules), regex (rules + "
                         "regex), unique (rules + unique)")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="bench_wap_"))
    os.environ.update({"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}",
                       "LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
                       "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}"})
    os.environ.setdefault("LAKEHOUSE_SPARK_MASTER", "local[2]")
    os.environ.setdefault("LAKEHOUSE_SHUFFLE_PARTITIONS", "4")

    from lakehouse.metadata.loader import load_metadata
    from lakehouse.stage.runner import Batch, Platform, StageRunner
    from lakehouse.table.iceberg import MAIN

    platform = Platform.from_env()
    spark = platform.spark()
    data = home / "input"
    generate(spark, data, args.rows, args.files)
    tables = platform.tables()
    print(f"input: {args.rows} rows in {args.files} parquet files at {data}")

    def apply(config: str) -> None:
        path = home / "meta.yaml"
        path.write_text(META + RULES % EXTRA[config])
        platform.store.apply(load_metadata(path))

    def fresh(ident: str) -> None:
        spark.sql(f"DROP TABLE IF EXISTS {tables.qualified(ident)} PURGE")

    def direct(i: int) -> float:
        from lakehouse.metadata.model import Target

        target = Target(target_id="bench_direct", namespace="bench", table="events_direct")
        fresh(target.identifier)
        t0 = time.monotonic()
        df = spark.read.parquet(str(data))
        tables.ensure_table(target, df.schema, wap=False)
        tables.write(df, target, branch=MAIN)
        return time.monotonic() - t0

    def wap(i: int) -> float:
        fresh("bench.events_wap")
        t0 = time.monotonic()
        runner = StageRunner(platform, "bench_wap", "load", run_id=f"bench_{i}_{time.time_ns()}")
        out = runner.wap().run([Batch(spark.read.parquet(str(data)), label="bench")])
        assert out.published and out.rows_written == args.rows, out
        sources.update({c.rule.name: c.details.get("counted_from", "-") for c in out.checks})
        return time.monotonic() - t0

    phases = _instrument()
    sources: dict[str, str] = {}
    results = {}
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(wanted) - set(EXTRA)
    if unknown:
        raise SystemExit(f"--configs: unknown rule set(s) {sorted(unknown)}; choose from {sorted(EXTRA)}")
    for label in wanted:
        apply(label)
        sources.clear()
        direct(-1), wap(-1)  # warm-up: JIT, catalog tables, first commits
        d, w = [], []
        for i in range(args.rounds):
            if i % 2 == 0:
                d.append(direct(i))
                w.append(wap(i))
            else:
                w.append(wap(i))
                d.append(direct(i))
        ratio = statistics.median(w) / statistics.median(d)
        results[label] = ratio
        print(f"{label:6s} counted from: " + ", ".join(f"{k} {v}" for k, v in sources.items()))
        print(f"{label:6s} wap phases (mean s): "
              + ", ".join(f"{k} {statistics.mean(v):.2f}" for k, v in phases.items() if v))
        phases.clear()
        print(f"{label:6s} direct: {', '.join(f'{x:.2f}s' for x in d)} | "
              f"wap+checks: {', '.join(f'{x:.2f}s' for x in w)} | ratio (median) {ratio:.3f}")
    for label, ratio in results.items():
        print(f"RATIO {label}: {ratio:.3f} (goal <= 1.15)")


if __name__ == "__main__":
    main()
