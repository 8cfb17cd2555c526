"""Rule evaluation on both engines: `evaluate` (every rule's outcome) and `tag_failures` (the
`_failed_rules` of every row) over the same rows, this checkout against `--baseline-repo` (another
checkout: `mkdir /tmp/base && git archive <commit> | tar -x -C /tmp/base`).

    nice -n 10 .venv/bin/python bench/bench_rules.py --rows 1000000 --rounds 2 --reps 3 --baseline-repo /tmp/base

Each side runs in its own process (its own `lakehouse` package first on PYTHONPATH), sides
alternating per round; each child builds the same rows (seeded: NULLs, eight strings, doubles),
warms up once, then times one `evaluate` and one `tag_failures` (materialised: an Arrow table, a
Spark count) per engine `--reps` times and keeps the best. The rules: not_null, accepted_values,
two ranges, a regex over strings and one over doubles, an expression, row_count. The outcomes of
both sides are compared and must be equal. Prints the median seconds per side and their ratio
(this / baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, sys, time
import numpy as np
import pyarrow as pa
from lakehouse.engines import engine_for
from lakehouse.metadata.model import Rule

rows, engines, reps = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
rng = np.random.default_rng(7)
n = rng.integers(-100, 1200, rows)
s = np.array(list("abcdefgh"))[rng.integers(0, 8, rows)]
d = rng.normal(50, 40, rows)
table = pa.table({
    "id": pa.array(np.arange(rows)),
    "n": pa.array(n, mask=rng.random(rows) < 0.01),
    "s": pa.array(s, mask=rng.random(rows) < 0.01),
    "d": pa.array(np.round(d, 1)),
})
rules = [
    Rule(name="nn", type="not_null", columns=["n", "s"]),
    Rule(name="av", type="accepted_values", column="s", values=["a", "b", "c", "d", "e"]),
    Rule(name="range_n", type="range", column="n", min=0, max=1000),
    Rule(name="range_d", type="range", column="d", min=0.0),
    Rule(name="regex_s", type="regex", column="s", pattern="^[a-e]$"),
    Rule(name="regex_d", type="regex", column="d", pattern="^[0-9]+[.]5$"),
    Rule(name="expr", type="expression", expression="n > 1 AND s <> 'b'"),
    Rule(name="row_count", type="row_count", min=1),
]
out = {}
for name in engines:
    engine = engine_for(name)
    if name == "spark":
        import pyarrow.parquet as pq
        from lakehouse.settings import load_settings
        from lakehouse.runtime.spark import get_spark
        spark = get_spark(load_settings(), app_name="bench-rules")
        path = os.path.join(os.environ["LAKEHOUSE_HOME"], "bench_rules.parquet")
        pq.write_table(table, path)
        frame = spark.read.parquet(path).cache()
        frame.count()
        def tag():
            return engine.tag_failures(frame, rules, {}, "UTC").where("size(_failed_rules) > 0").count()
    else:
        frame = table
        def tag():
            t = engine.tag_failures(frame, rules, {}, "UTC")
            return t.num_rows
    def evaluate():
        return engine.evaluate(frame, rules, {"time_zone": "UTC"})
    evaluate(); tag()  # warm up: imports, JIT, connections
    best = {"evaluate": float("inf"), "tag": float("inf")}
    for _ in range(reps):  # the best of `reps`: the machine's other load only ever adds time
        t0 = time.perf_counter(); outcomes = evaluate(); t1 = time.perf_counter(); tag(); t2 = time.perf_counter()
        best = {"evaluate": min(best["evaluate"], t1 - t0), "tag": min(best["tag"], t2 - t1)}
    out[name] = {**best,
                 "outcomes": [[o.rule.name, o.passed, o.failed_rows, o.total_rows, o.message] for o in outcomes]}
print(json.dumps(out))
"""


def run_side(repo: Path, rows: int, engines: str, reps: int, home: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(repo), "LAKEHOUSE_HOME": home, "LAKEHOUSE_SPARK_MASTER": "local[2]",
           "LAKEHOUSE_SHUFFLE_PARTITIONS": "2"}
    res = subprocess.run([sys.executable, "-c", CHILD, str(rows), engines, str(reps)], env=env, cwd=repo,
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"{repo}: {res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", default="arrow,spark")
    ap.add_argument("--reps", type=int, default=3, help="timings per child process; the best counts")
    ap.add_argument("--baseline-repo", type=Path, help="another checkout to compare with")
    args = ap.parse_args()
    sides = {"this": REPO} | ({"baseline": args.baseline_repo.resolve()} if args.baseline_repo else {})
    times: dict[str, dict[str, list[float]]] = {s: {} for s in sides}
    outcomes: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as home:
        for _ in range(args.rounds):
            for side, repo in sides.items():
                got = run_side(repo, args.rows, args.engines, args.reps, home)
                for engine, r in got.items():
                    for what in ("evaluate", "tag"):
                        times[side].setdefault(f"{engine} {what}", []).append(r[what])
                    outcomes.setdefault(engine, {})[side] = r["outcomes"]
    for engine, by_side in outcomes.items():
        if len({json.dumps(v) for v in by_side.values()}) != 1:
            print(f"OUTCOMES DIFFER on {engine}: {json.dumps(by_side, indent=1)}")
    print(f"{args.rows} rows, {args.rounds} rounds, median seconds")
    for key in times["this"]:
        this = statistics.median(times["this"][key])
        line = f"  {key:16s} this {this:7.3f}"
        if "baseline" in times:
            base = statistics.median(times["baseline"][key])
            line += f"  baseline {base:7.3f}  ratio {this / base:5.2f}"
        print(line)


if __name__ == "__main__":
    main()
