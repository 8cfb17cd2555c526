"""The JSON-lines probe over the demo's landing (`lakehouse demo`, 8 files): CPU and wall of
`probe_file` on every file, this checkout against `--baseline-repo` (another checkout), side by side.

    .venv/bin/python bench/bench_probe.py --rows 200000 --rounds 5 --baseline-repo /tmp/base

Two expectations: `declared` (the demo's declared columns, what its first run checks: `user_id`
bigint) and `typed` (a table that already types `event_ts` as timestamp and `country` as string:
the steady state of a recurring load whose table has a timestamp). Each side runs in its own
process (its own `lakehouse` package on PYTHONPATH), sides alternating per round; the verdicts
and schemas of both sides are compared and must be equal.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import demo_landing  # noqa: E402  (one copy of the demo's landing)

CHILD = r"""
import json, sys, time
from pathlib import Path
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType
from lakehouse.ingest.probe import probe_file
from lakehouse.metadata.model import FileLimits
ctx = StructType([StructField("device", StringType()), StructField("app_version", StringType())])
expects = {
    "declared": {"event_id": StringType(), "user_id": LongType(), "event_type": StringType(),
                 "event_ts": StringType(), "country": StringType(), "context": ctx},
    "typed": {"event_id": StringType(), "user_id": LongType(), "event_type": StringType(),
              "event_ts": TimestampType(), "country": StringType(), "context": ctx},
}
files = sorted(Path(sys.argv[1]).glob("*.jsonl"))
lim = FileLimits()
probe_file(files[0], "jsonl", limits=lim, expect=expects["declared"])  # imports, warm
out = {}
for name, expect in expects.items():
    c0, w0 = time.process_time(), time.perf_counter()
    res = [probe_file(f, "jsonl", limits=lim, expect=expect) for f in files]
    out[name] = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - w0,
                 "verdicts": [(p.status, p.error, p.rows, p.schema.simpleString() if p.schema else None) for p in res]}
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline-repo", type=Path, required=True)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_probe_"))
    landing = demo_landing(work, args.rows)
    sides = {"this": REPO, "baseline": args.baseline_repo.resolve()}
    got: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            env = {**os.environ, "PYTHONPATH": str(sides[side])}
            res = subprocess.run([sys.executable, "-c", CHILD, str(landing / "user_events")], env=env,
                                 cwd=sides[side], check=True, capture_output=True, text=True)
            got[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"  round {r + 1} {side:8s} " + ", ".join(
                f"{k} cpu {v['cpu']:.3f} s wall {v['wall']:.3f} s" for k, v in got[side][-1].items())
                + f"  load {os.getloadavg()[0]:.1f}", flush=True)
    for case in got["this"][0]:
        same = all(g[case]["verdicts"] == got["baseline"][0][case]["verdicts"] for s in sides for g in got[s])
        cpu = {s: statistics.median(g[case]["cpu"] for g in got[s]) for s in sides}
        wall = {s: statistics.median(g[case]["wall"] for g in got[s]) for s in sides}
        print(f"{case}: CPU this {cpu['this']:.3f} s | baseline {cpu['baseline']:.3f} s | ratio "
              f"{cpu['this'] / cpu['baseline']:.3f}; wall {wall['this']:.3f} / {wall['baseline']:.3f} s = "
              f"{wall['this'] / wall['baseline']:.3f}; same verdicts and schemas: {same}")


if __name__ == "__main__":
    main()
