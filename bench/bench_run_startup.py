"""`lakehouse run`'s fixed start-up CPU, this tree against a baseline tree, in alternating pairs (issue 21).

    .venv/bin/python bench/bench_run_startup.py --baseline /tmp/main --pairs 8
    .venv/bin/python bench/bench_run_startup.py --baseline /tmp/main --pairs 6 --mode spark

`--baseline DIR`: a `git archive main` copy. Each run is a fresh process from one tree (cwd and
PYTHONPATH set to it, `PYTHONPYCACHEPREFIX` per tree, this interpreter), on a fresh home; the two
trees alternate and the order flips every pair; one untimed run per tree first (bytecode, the
Dagster templates). The CPU is user + sys of the process and the children it reaped (the shared
machine: CPU, not wall, separates the trees); the load average goes with it.

* `--mode arrow` (default): `python -m lakehouse.cli run bench` over 1,000 landed rows, the
  bench_small_batches metadata with `engine: arrow` (no JVM): the whole run.
* `--mode spark`: the demo (`metadata/demo`, its bronze `engine: auto` set to `spark`) over
  `--rows` events, `LAKEHOUSE_SPARK_WARMUP=0` (no JVM at all), run through the entry with
  `lakehouse.runtime.spark.get_spark` replaced by a recorder of the process's CPU and wall at its first
  call, which then ends the process: what a Spark run's driver spends before it asks for its session.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_small_batches import META, land  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

#: `lakehouse run ...` through the package's entry, its first get_spark recording CPU and wall to argv[1]
FIRST_SPARK = """
import os, runpy, sys, time
out = sys.argv[1]; sys.argv = ["lakehouse", *sys.argv[2:]]
import lakehouse.runtime.spark as spark
from lakehouse.runtime import procstat
def first(*args, **kwargs):
    cpu, wall = time.process_time(), time.time() - procstat.read(os.getpid()).start_epoch()
    with open(out, "w") as f:
        f.write(f"{cpu} {wall}")
    os._exit(0)
spark.get_spark = first
runpy.run_module("lakehouse", run_name="__main__", alter_sys=False)
"""


def _env(tree: Path, home: Path, tag: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME", "PYTHON"))}
    env.update(LAKEHOUSE_HOME=str(home), PYTHONPATH=str(tree), PYTHONPYCACHEPREFIX=str(home.parent.parent / f"pyc_{tag}"),
               **extra)
    return env


def arrow_run(tree: Path, tag: str, work: Path) -> tuple[float, float]:
    """(wall, CPU) of `lakehouse run bench` on a fresh home with 1,000 rows landed."""
    home = Path(tempfile.mkdtemp(dir=work)) / "home"
    home.mkdir()
    (home / "meta.yaml").write_text(META.format(engine="arrow"))
    env = _env(tree, home, tag)
    cli = [PY, "-m", "lakehouse.cli"]
    subprocess.run([*cli, "metadata", "apply", str(home / "meta.yaml")], cwd=tree, env=env, check=True,
                   capture_output=True)
    land(home / "landing" / "events", 1_000)
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run([*cli, "run", "bench"], cwd=tree, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 3 or "bronze/events  published" not in done.stdout:  # 3: one row quarantined
        raise SystemExit(f"{tree}: the run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    shutil.rmtree(home.parent)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spark_first(tree: Path, tag: str, work: Path, landing: Path) -> tuple[float, float]:
    """(wall, CPU) of a demo run with bronze on Spark until its first get_spark."""
    home = Path(tempfile.mkdtemp(dir=work)) / "home"
    home.mkdir()
    meta = home.parent / "meta"
    shutil.copytree(tree / "metadata" / "demo", meta)
    events = meta / "user_events.yaml"
    if "engine: auto" not in events.read_text():
        raise SystemExit(f"{tree}: no `engine: auto` in {events}: the demo changed, update this bench")
    events.write_text(events.read_text().replace("engine: auto", "engine: spark"))
    env = _env(tree, home, tag, LAKEHOUSE_LANDING_DIR=str(landing), LAKEHOUSE_SPARK_WARMUP="0")
    subprocess.run([PY, "-m", "lakehouse.cli", "metadata", "apply", str(meta)], cwd=tree, env=env, check=True,
                   capture_output=True)
    out = home.parent / "first.txt"
    done = subprocess.run([PY, "-c", FIRST_SPARK, str(out), "run", "user_events_etl"], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"{tree}: no get_spark ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    cpu, wall = map(float, out.read_text().split())
    shutil.rmtree(home.parent)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="a `git archive main` copy to compare against")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--mode", choices=("arrow", "spark"), default="arrow")
    ap.add_argument("--rows", type=int, default=200_000, help="--mode spark: the demo's events")
    args = ap.parse_args()
    trees = {"baseline": args.baseline.resolve(), "this": REPO}
    work = Path(tempfile.mkdtemp(prefix="bench_run_startup_"))
    try:
        if args.mode == "spark":
            landing = work / "landing"
            subprocess.run([PY, "-m", "lakehouse.cli", "demo", "--rows", str(args.rows)], cwd=REPO, check=True,
                           capture_output=True, env=_env(REPO, work / "gen" / "home", "gen",
                                                         LAKEHOUSE_LANDING_DIR=str(landing)))
            one = lambda name: spark_first(trees[name], name, work, landing)  # noqa: E731
        else:
            one = lambda name: arrow_run(trees[name], name, work)  # noqa: E731
        for name in trees:  # untimed: bytecode, templates
            one(name)
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        lower, loads = 0, []
        for i in range(args.pairs):
            pair = {}
            for name in (("baseline", "this") if i % 2 == 0 else ("this", "baseline")):
                pair[name] = one(name)
                got[name].append(pair[name])
                loads.append(os.getloadavg()[0])
            lower += pair["this"][1] < pair["baseline"][1]
            print(f"pair {i + 1}: baseline {pair['baseline'][1]:.3f} s CPU ({pair['baseline'][0]:.2f} s wall) | this "
                  f"{pair['this'][1]:.3f} s CPU ({pair['this'][0]:.2f} s wall)  load {loads[-1]:.2f}", flush=True)
        what = "the run" if args.mode == "arrow" else "to the first get_spark"
        med = {name: (statistics.median(c for _, c in runs), statistics.median(w for w, _ in runs))
               for name, runs in got.items()}
        for name, (cpu, wall) in med.items():
            print(f"{name:8s} {trees[name]}: {what}: CPU median {cpu:.3f} s, wall median {wall:.2f} s")
        print(f"this / baseline: CPU {med['this'][0] / med['baseline'][0]:.3f}x, wall {med['this'][1] / med['baseline'][1]:.3f}x; "
              f"this lower in {lower} of {args.pairs} pairs; load average {min(loads):.2f}-{max(loads):.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
