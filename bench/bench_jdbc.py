"""Partitioned vs single-query JDBC extraction, and the quantile split on a skewed column.

Starts a private PostgreSQL 15 (or uses --jdbc-url/--user-env/--password-env), generates a table
with generate_series, then times Spark reading every row (noop sink, so only extraction counts):
  * single query                        (one connection, one task)
  * partitioned, uniform column `id`    (Spark partitionColumn/lowerBound/upperBound/numPartitions)
  * partitioned, skewed column `k`, Spark's stride ranges vs the planner's quantile ranges
and prints the speed-up and each split's largest range share (counted in PostgreSQL).

    .venv/bin/python bench/bench_jdbc.py                 # 5,000,000 rows
    .venv/bin/python bench/bench_jdbc.py --rows 20000000 --partition-size 1000000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lakehouse.ingest import jdbc  # noqa: E402
from lakehouse.metadata.model import Source  # noqa: E402


def generate(server, dbname: str, rows: int) -> float:
    t0 = time.monotonic()
    c = server.connect(dbname)
    c.autocommit = True
    with c.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS bench_facts")
        # k: 90% of rows in [0, 100), the rest spread up to rows*1000 (a skewed "customer id")
        cur.execute(
            "CREATE UNLOGGED TABLE bench_facts AS SELECT g::bigint AS id, "
            "CASE WHEN g %% 10 <> 0 THEN g %% 100 ELSE g::bigint * 1000 END AS k, "
            "(g %% 100000) * 0.01 AS amount, TIMESTAMP '2024-01-01' + g * INTERVAL '1 second' AS ts, "
            "md5(g::text) AS payload FROM generate_series(1, %s) g", (rows,))
        # range reads need an index on the partition column, or every range is a full table scan
        cur.execute("CREATE INDEX ON bench_facts (id)")
        cur.execute("CREATE INDEX ON bench_facts (k)")
        cur.execute("ANALYZE bench_facts")
    c.close()
    return time.monotonic() - t0


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (/proc/stat): Spark and PostgreSQL together."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


BUSY: dict[int, float] = {}  # id(src) -> cores busy during its last read


def timed_read(spark, conn, src: Source, details: dict) -> tuple[float, int]:
    df = jdbc.read_source(spark, conn, src, details)
    t0, b0 = time.monotonic(), busy_seconds()
    df.write.format("noop").mode("overwrite").save()
    elapsed = time.monotonic() - t0
    BUSY[id(src)] = (busy_seconds() - b0) / elapsed
    return elapsed, df.rdd.getNumPartitions()


def range_shares(server, dbname: str, column: str, predicates: list[str], total: int) -> list[float]:
    c = server.connect(dbname)
    out = []
    with c.cursor() as cur:
        for p in predicates:
            cur.execute(f"SELECT count(*) FROM bench_facts WHERE {p}")  # predicates quote their identifiers
            out.append(cur.fetchone()[0] / total)
    c.close()
    return out


def stride_predicates(d, column: str, lo: int, hi: int, n: int) -> list[str]:
    """The ranges Spark's partitionColumn split produces (same stride arithmetic)."""
    edges = [int(e) for e in jdbc.uniform_edges(lo, hi + 1, n)]
    return jdbc.range_predicates(d, column, edges)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--partition-size", type=int, default=500_000, help="partition_size_rows")
    ap.add_argument("--max-partitions", type=int, default=16)
    ap.add_argument("--fetchsize", type=int, default=10_000)
    ap.add_argument("--master", default=os.environ.get("LAKEHOUSE_SPARK_MASTER", "local[2]"))
    ap.add_argument("--repeat", type=int, default=1, help="runs per variant (best is reported)")
    ap.add_argument("--url-params", default="", help="JDBC URL parameters for both sides, e.g. prepareThreshold=-1")
    args = ap.parse_args()

    from tests.fixtures.postgres import start_postgres

    home = Path(tempfile.mkdtemp(prefix="bench-jdbc-"))
    os.environ.setdefault("LAKEHOUSE_HOME", str(home))
    os.environ["LAKEHOUSE_SPARK_MASTER"] = args.master
    os.environ.setdefault("LAKEHOUSE_SPARK_DRIVER_MEMORY", "3g")
    server, stop = start_postgres()
    try:
        dbname = server.create_database("bench")
        os.environ["BENCH_PG_USER"], os.environ["BENCH_PG_PASSWORD"] = server.user, server.password
        gen_s = generate(server, dbname, args.rows)
        print(f"generated {args.rows:,} rows in PostgreSQL in {gen_s:.1f}s")

        from lakehouse.runtime.spark import get_spark
        from lakehouse.settings import load_settings

        spark = get_spark(load_settings(), app_name="bench-jdbc")
        common = dict(source_id="bench", kind="jdbc", jdbc_url=server.jdbc_url(dbname) + (f"?{args.url_params}" if args.url_params else ""),
                      table="public.bench_facts",
                      user_env="BENCH_PG_USER", password_env="BENCH_PG_PASSWORD", fetchsize=args.fetchsize,
                      partition_size_rows=args.partition_size, max_partitions=args.max_partitions)
        single_src = Source(**common)
        conn = jdbc.JdbcConnection.for_source(single_src)
        d = conn.dialect

        def best(src, details):
            runs = [timed_read(spark, conn, src, details) for _ in range(args.repeat)]
            return min(r[0] for r in runs), runs[0][1]

        uni_src = Source(**common, partitioned=True, partition_column="id")
        uni_ranges = jdbc.plan_ranges(conn, spark, uni_src, None, None)
        # warm the JVM and the PostgreSQL cache once, so neither variant pays first-touch costs
        timed_read(spark, conn, uni_src, {"ranges": uni_ranges})

        t_single, _ = best(single_src, {"ranges": {"mode": "single"}})
        t_uni, n_uni = best(uni_src, {"ranges": uni_ranges})

        sk_stride = Source(**common, partitioned=True, partition_column="k", options={"partition_strategy": "uniform"})
        sk_quant = Source(**common, partitioned=True, partition_column="k")
        r_stride = jdbc.plan_ranges(conn, spark, sk_stride, None, None)
        t0 = time.monotonic()
        r_quant = jdbc.plan_ranges(conn, spark, sk_quant, None, None)
        plan_s = time.monotonic() - t0
        t_stride, n_stride = best(sk_stride, {"ranges": r_stride})
        t_quant, n_quant = best(sk_quant, {"ranges": r_quant})

        rows = args.rows
        lo, hi = int(r_stride["lower_bound"]), int(r_stride["upper_bound"]) - 1
        stride_share = max(range_shares(server, dbname, "k", stride_predicates(d, "k", lo, hi, r_stride["num_partitions"]), rows))
        quant_share = max(range_shares(server, dbname, "k", r_quant["predicates"], rows))

        print()
        print(f"{'variant':48} {'partitions':>10} {'seconds':>9} {'rows/s':>12} {'speed-up':>9} {'cores busy':>10}")
        for name, n, t, src in [
            ("single query", 1, t_single, single_src),
            ("partitioned on id (uniform, Spark ranges)", n_uni, t_uni, uni_src),
            ("partitioned on k (skewed, Spark stride ranges)", n_stride, t_stride, sk_stride),
            (f"partitioned on k (skewed, quantile ranges; plan {plan_s:.1f}s)", n_quant, t_quant, sk_quant),
        ]:
            print(f"{name:48} {n:>10} {t:>9.2f} {rows / t:>12,.0f} {t_single / t:>8.2f}x {BUSY[id(src)]:>10.2f}")
        cores = os.cpu_count() or 1
        print(f"\nthe single query keeps {BUSY[id(single_src)]:.2f} of {cores} cores busy (Spark and PostgreSQL "
              f"together), so no split can beat {cores / BUSY[id(single_src)]:.2f}x on this machine")
        print()
        print(f"largest range share on skewed k: Spark stride split {stride_share:.1%} of rows "
              f"(ideal {1 / r_stride['num_partitions']:.1%}); quantile split {quant_share:.1%} "
              f"(ideal {1 / len(r_quant['predicates']):.1%})")
        print(f"planner estimate: uniform {r_quant['estimated_max_share_uniform']:.1%}, "
              f"quantile {r_quant['estimated_max_share_quantile']:.1%}; mode chosen: {r_quant['mode']}")
        print(f"speed-up partitioned (uniform id) vs single query: {t_single / t_uni:.2f}x "
              f"(goal >= 1.7x on 2 cores, master {args.master})")
        spark.stop()
    finally:
        stop()


if __name__ == "__main__":
    main()
