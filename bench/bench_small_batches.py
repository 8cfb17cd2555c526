"""Small batches through both write engines: end-to-end `lakehouse run` time, Spark / Arrow.

    .venv/bin/python bench/bench_small_batches.py                     # 1k, 10k, 100k, 1M rows; 3 rounds
    .venv/bin/python bench/bench_small_batches.py --sizes 1000 10000 --rounds 5
    .venv/bin/python bench/bench_small_batches.py --warm   # a source's second arrival, not its first
    .venv/bin/python bench/bench_small_batches.py --rollup # + a roll-up stage (Spark SQL vs DuckDB on Arrow)

One pipeline, one bronze stage: JSON-lines files (100,000 rows per file at most) landed in a fresh
platform home, loaded by `lakehouse run bench` in a fresh process (Dagster, the job, the stage's
write-audit-publish with a quarantine rule and a uniqueness check, the run summary) with the
target's `engine: spark` on one side and `engine: arrow` on the other. Sides alternate within each
round and the order flips every round; each run gets a new home, so nothing is cached between
them. Prints every run, then per size the median seconds, the ratio Spark / Arrow (goal: >= 5 for
up to 100k rows), the input bytes, and the crossover: the largest input at which Arrow is still
faster, which is what `engine.arrow_max_bytes` (lakehouse.engines.choice.DEFAULT_ARROW_MAX_BYTES) should
be at most. The load average goes with the numbers (2 shared cores: read the ratios), and so does
the CPU time of each run's process (user + system, of it and the children it reaped): under
contention a many-threaded JVM gets a bigger share of the cores than the mostly single-threaded
Arrow path, which wall time alone hides. The JVM of a Spark run exits after its parent and is not
counted, so Spark's CPU seconds and the CPU ratio are lower bounds. A fresh home's Dagster databases
are copies of templates built once per machine in `~/.cache/lakehouse` (or `$LAKEHOUSE_CACHE_DIR`;
lakehouse.throughput.dagster_storage), as for any platform install after its first run: the bench
builds them before the first timed run (LAKEHOUSE_DAGSTER_TEMPLATES=0 in its environment times
Dagster's own creation instead).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS_PER_FILE = 100_000
KEPT_ENV = ("LAKEHOUSE_DAGSTER_TEMPLATES", "LAKEHOUSE_CACHE_DIR")  # the machine's, not a home's
META = """
pipelines: [{{pipeline_id: bench}}]
sources:
  - {{source_id: events_raw, kind: files, format: jsonl, path: events, glob: "*.jsonl"}}
targets:
  - {{target_id: bronze_events, namespace: bronze, table: events, engine: {engine}}}
stages:
  - {{pipeline_id: bench, stage_order: 1, stage_name: ingest, layer: bronze, source_id: events_raw,
     target_id: bronze_events, validation_set_id: rules}}
validation_rules:
  - rule_set_id: rules
    rules:
      - {{name: id_present, type: not_null, columns: [event_id], action: quarantine, severity: warn}}
      - {{name: id_unique, type: unique, columns: [event_id]}}
      - {{name: type_known, type: accepted_values, column: event_type, values: [view, click, purchase, signup]}}
"""


#: `--rollup`: a second stage, a roll-up of the loaded events by type (a full recompute), on Spark
#: SQL written by Spark on one side and on DuckDB written by the Arrow engine on the other: the
#: whole pipeline without a JVM
ROLLUP_TARGET = ("  - {{target_id: gold_by_type, namespace: gold, table: events_by_type, write_mode: overwrite, "
                 "engine: {engine}}}\n")
ROLLUP_STAGE = ("  - {{pipeline_id: bench, stage_order: 2, stage_name: by_type, layer: gold, target_id: gold_by_type, "
                "sql_engine: {sql_engine}, transformation: \"SELECT event_type, COUNT(*) AS events, SUM(amount) AS "
                "amount FROM bronze.events GROUP BY event_type\"}}\n")


def metadata(engine: str, rollup: bool = False) -> str:
    text = META if not rollup else META.replace("stages:\n", ROLLUP_TARGET + "stages:\n").replace(
        "validation_rules:\n", ROLLUP_STAGE + "validation_rules:\n")
    return text.format(engine=engine, sql_engine="duckdb" if engine == "arrow" else "spark")


def land(folder: Path, rows: int, tag: str = "events") -> int:
    """`rows` events in files of at most ROWS_PER_FILE; every 1000th has no id. Returns bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for f, start in enumerate(range(0, rows, ROWS_PER_FILE)):
        lines = []
        for n in range(start, min(rows, start + ROWS_PER_FILE)):
            lines.append(json.dumps({"event_id": None if n % 1000 == 999 else f"{tag}{n:010d}", "user_id": n % 5000,
                                     "event_type": ("view", "click", "purchase", "signup")[n % 4],
                                     "event_ts": f"2026-01-01 {n % 24:02d}:{n % 60:02d}:{n % 60:02d}",
                                     "amount": round(n * 0.01, 2), "context": {"device": "web", "v": "1.0"}},
                                    separators=(",", ":")))
        path = folder / f"{tag}-{f:03d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        total += path.stat().st_size
    return total


def one_run(engine: str, rows: int, warm: bool = False, rollup: bool = False) -> tuple[float, float, int, str]:
    """(wall seconds of `lakehouse run bench`, its CPU seconds, input bytes, the engine the run
    metadata names). `warm`: the timed run is the source's second arrival — a first run (not timed)
    has loaded a 10-row file, so the Dagster instance, the control DB and the table exist, as for
    every arrival after a platform's first."""
    home = Path(tempfile.mkdtemp(prefix=f"bench_small_{engine}_{rows}_"))
    (home / "meta.yaml").write_text(metadata(engine, rollup))
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV or not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env.update({"LAKEHOUSE_HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"})
    cli = [sys.executable, "-m", "lakehouse.cli"]
    subprocess.run([*cli, "metadata", "apply", str(home / "meta.yaml")], env=env, check=True, capture_output=True)
    if warm:
        land(home / "landing" / "events", 10, tag="first")
        first = subprocess.run([*cli, "run", "bench"], env=env, capture_output=True, text=True)
        if first.returncode != 0:
            raise SystemExit(f"{engine} first arrival failed ({first.returncode}):\n{first.stdout[-3000:]}")
    size = land(home / "landing" / "events", rows)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([*cli, "run", "bench"], env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{engine} {rows} rows failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    from lakehouse.metadata.store import MetadataStore

    store = MetadataStore(f"sqlite:///{home / 'control.db'}")
    engines = {e.details.get("engine", "?") for e in store.audit_entries(event="stage_started")}
    ran = engines.pop() if len(engines) == 1 else "/".join(sorted(engines)) or "?"  # the warm run's first, too
    store.engine.dispose()
    subprocess.run(["rm", "-rf", str(home)], check=False)
    return took, cpu, size, ran


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", action="store_true",
                    help="time a source's second arrival (instance, control DB and table exist), not its first")
    ap.add_argument("--rollup", action="store_true",
                    help="add a roll-up stage: Spark SQL written by Spark vs DuckDB written by the Arrow engine")
    args = ap.parse_args()
    try:  # Dagster's database templates, built once per machine (not timed, as after an install's first run)
        from lakehouse.throughput.dagster_storage import templates
    except ImportError:  # a tree without them (they were a private-API speed-up, removed by issue 38)
        pass
    else:
        templates()
    times: dict[tuple[int, str], list[float]] = {}
    cpus: dict[tuple[int, str], list[float]] = {}
    sizes: dict[int, int] = {}
    loads = []
    for r in range(args.rounds):
        for rows in args.sizes:
            order = ("spark", "arrow") if (r + args.sizes.index(rows)) % 2 == 0 else ("arrow", "spark")
            for engine in order:
                took, cpu, size, ran = one_run(engine, rows, warm=args.warm, rollup=args.rollup)
                assert ran == engine, f"asked for {engine}, the run says {ran}"
                times.setdefault((rows, engine), []).append(took)
                cpus.setdefault((rows, engine), []).append(cpu)
                sizes[rows] = size
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1} {rows:>9,} rows {engine:5s}: {took:7.2f} s wall, {cpu:7.2f} s CPU  "
                      f"(load {loads[-1]:.2f})", flush=True)
    print(f"\n{'second arrivals (--warm)' if args.warm else 'first runs on a fresh home'}; medians of {args.rounds} round(s), load average 1-min over the runs: "
          f"min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f}")
    print(f"{'rows':>10} {'input MB':>9} {'spark s':>8} {'arrow s':>8} {'spark/arrow':>12} "
          f"{'spark CPU*':>10} {'arrow CPU':>10} {'CPU ratio*':>10}   (*JVM not counted: lower bounds)")
    faster = []
    for rows in args.sizes:
        s, a = statistics.median(times[(rows, "spark")]), statistics.median(times[(rows, "arrow")])
        sc, ac = statistics.median(cpus[(rows, "spark")]), statistics.median(cpus[(rows, "arrow")])
        print(f"{rows:>10,} {sizes[rows] / 1e6:>9.1f} {s:>8.2f} {a:>8.2f} {s / a:>11.2f}x "
              f"{sc:>10.2f} {ac:>10.2f} {sc / ac:>9.2f}x")
        if s > a:
            faster.append(rows)
    if faster and faster[-1] == args.sizes[-1]:
        print(f"crossover: above {args.sizes[-1]:,} rows ({sizes[args.sizes[-1]] / 1e6:.0f} MB): Arrow was faster at every size")
    elif faster:
        print(f"crossover: between {faster[-1]:,} rows ({sizes[faster[-1]] / 1e6:.0f} MB, Arrow faster) and the next "
              "size (Spark faster)")
    else:
        print("crossover: Spark was faster at every size")


if __name__ == "__main__":
    main()
