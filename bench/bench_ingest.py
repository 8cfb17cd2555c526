"""Platform vs hand-written PySpark: ingest the same parquet files into an Iceberg table.

    .venv/bin/python bench/bench_ingest.py --gb 1.0 --repeat 2

Both sides run as fresh processes (cold JVM) with the same Spark settings (lakehouse.runtime.spark.spark_conf):
  * platform:     `lakehouse run bench_ingest` (Dagster job, extract + load ops, audit branch, publish,
                  checkpoint in the snapshot summary);
  * hand-written: a PySpark script that reads the files and appends them to an Iceberg table.
Both sides write the same table, so they are compared twice: with the lineage columns
`_source_file` / `_ingested_at` (the source's default `lineage_columns: true`; the script adds
the same two columns) and without them (`lineage_columns: false`; the script appends the files
as they are). Prints each timing and the ratio platform / hand-written per pair (goal ≤ 1.10).

`--baseline-repo DIR` also times the platform of another checkout (e.g. `git archive main | tar -x
-C DIR`) in the same rounds, so a change's cost is measured against the code before it on the same
machine state; the sides run in a rotating order, round by round.

Besides wall time, each run's CPU time is measured: user + system seconds of the run's whole process
tree, the JVM included (this process becomes the Linux child subreaper, so the JVM a run leaves
behind is reaped here and counted). On a shared machine wall time swings with the other load; the
CPU a run needs swings much less, so its ratio shows a change's cost when the wall ratio cannot.
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
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

HANDWRITTEN = textwrap.dedent(
    """
    import sys, time
    from lakehouse.settings import load_settings
    from lakehouse.runtime.spark import get_spark
    t0 = time.monotonic()
    spark = get_spark(load_settings(), app_name="handwritten")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.hand")
    df = spark.read.parquet(sys.argv[1])
    if sys.argv[2] == "lineage":
        from pyspark.sql import functions as F
        df = df.withColumn("_source_file", F.input_file_name()).withColumn("_ingested_at", F.current_timestamp())
    df.writeTo("lake.hand.events").using("iceberg").createOrReplace()
    print("rows", spark.table("lake.hand.events").count(), "seconds", round(time.monotonic() - t0, 2))
    """
)

METADATA = """
pipelines:
  - {{pipeline_id: bench_ingest}}
sources:
  - {{source_id: bench_files, kind: files, format: parquet, path: {landing}, glob: "*.parquet",
     batch_files: 100000, batch_bytes: 1000000000000, max_files_per_run: 100000, max_bytes_per_run: 1000000000000,
     lineage_columns: {lineage}}}
targets:
  - {{target_id: bench_bronze, namespace: bronze, table: events, write_mode: append}}
stages:
  - {{pipeline_id: bench_ingest, stage_order: 1, stage_name: ingest, layer: bronze, source_id: bench_files,
     target_id: bench_bronze}}
"""


def generate(out: Path, gb: float, files: int) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    target = gb * 1024**3
    rows_per_file, written, i = 2_000_000, 0, 0
    while written < target:
        n = rows_per_file
        table = pa.table({
            "event_id": pa.array(rng.integers(0, 2**62, n)),
            "user_id": pa.array(rng.integers(1, 1_000_000, n)),
            "amount": pa.array(rng.random(n) * 1000),
            "ts": pa.array(rng.integers(1_700_000_000_000, 1_800_000_000_000, n)).cast(pa.timestamp("ms")),
            "payload": pa.array([f"p{x:016x}" for x in rng.integers(0, 2**62, n)]),
        })
        p = out / f"part-{i:05d}.parquet"
        pq.write_table(table, p, compression="snappy")
        written += p.stat().st_size
        i += 1
        if files and i >= files and written >= target:
            break
    return written


def demo_landing(work: Path, rows: int) -> Path:
    """The demo's events (`lakehouse demo --rows`) landed under `work`/landing; returns that folder
    (the platform's LAKEHOUSE_LANDING_DIR for the runs over it)."""
    landing = work / "landing"
    env = {**os.environ, "LAKEHOUSE_HOME": str(work / "gen"), "LAKEHOUSE_LANDING_DIR": str(landing)}
    subprocess.run([PY, "-m", "lakehouse.cli", "demo", "--rows", str(rows)], env=env, cwd=REPO,
                   check=True, capture_output=True)
    return landing


def become_subreaper() -> bool:
    """Orphaned descendants (the JVM of a finished run) are re-parented to this process (Linux
    PR_SET_CHILD_SUBREAPER), so that reaping them adds their CPU time to RUSAGE_CHILDREN."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def run(cmd: list[str], env: dict, cwd: Path = REPO, ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process tree) of one command; an exit code not in `ok` stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:  # the JVM exits once its Python parent is gone: reap it (its CPU counts)
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                time.sleep(0.05)
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in ok:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"command failed: {' '.join(cmd)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--lineage", choices=("both", "lineage", "plain"), default="both",
                    help="which pair to time: with the lineage columns on both sides, without, or both")
    ap.add_argument("--baseline-repo", type=Path, default=None,
                    help="another checkout whose platform is timed in the same rounds (before/after a change)")
    args = ap.parse_args()
    sides = ["platform", "handwritten"] + (["baseline"] if args.baseline_repo else [])
    if not become_subreaper():
        print("note: not a Linux child subreaper: CPU times leave out the JVMs")

    work = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    data = work / "landing" / "events"
    size = generate(data, args.gb, 0)
    print(f"generated {size / 1024**3:.2f} GiB of parquet in {len(list(data.glob('*.parquet')))} files under {data}")
    modes = [m for m in ("lineage", "plain") if args.lineage in (m, "both")]
    times: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(args.repeat):
            for mode in modes:
                for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                    home = work / f"{side}_{mode}_{r}"
                    env = {**os.environ, "LAKEHOUSE_HOME": str(home), "LAKEHOUSE_LANDING_DIR": str(work / "landing")}
                    env.pop("DAGSTER_HOME", None)
                    if side in ("platform", "baseline"):
                        repo = REPO if side == "platform" else args.baseline_repo.resolve()
                        if side == "baseline":  # its own lakehouse package, not this checkout's
                            env["PYTHONPATH"] = str(repo)
                        meta = home / "meta.yaml"
                        home.mkdir(parents=True)
                        meta.write_text(METADATA.format(landing="events", lineage=str(mode == "lineage").lower()))
                        subprocess.run([PY, "-m", "lakehouse.cli", "metadata", "apply", str(meta)], env=env,
                                       check=True, cwd=repo, capture_output=True)
                        t, cpu = run([PY, "-m", "lakehouse.cli", "run", "bench_ingest"], env=env, cwd=repo)
                    else:
                        script = work / "hand.py"
                        script.write_text(HANDWRITTEN)
                        t, cpu = run([PY, str(script), str(data), mode], env=env)
                    times.setdefault((mode, side), []).append(t)
                    cpus.setdefault((mode, side), []).append(cpu)
                    print(f"  round {r + 1} {mode:7s} {side:11s} {t:7.1f} s  cpu {cpu:7.1f} s  "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                    shutil.rmtree(home / "warehouse", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for mode in modes:
        p, h = statistics.median(times[(mode, "platform")]), statistics.median(times[(mode, "handwritten")])
        pc, hc = statistics.median(cpus[(mode, "platform")]), statistics.median(cpus[(mode, "handwritten")])
        cols = "with _source_file/_ingested_at" if mode == "lineage" else "files' columns only"
        print(f"{cols:32s}: platform median {p:.1f} s | hand-written median {h:.1f} s | "
              f"ratio {p / h:.3f} (goal <= 1.10)")
        print(f"{'':32s}  CPU: platform median {pc:.1f} s | hand-written median {hc:.1f} s | ratio {pc / hc:.3f}")
        if args.baseline_repo:
            b = statistics.median(times[(mode, "baseline")])
            bc = statistics.median(cpus[(mode, "baseline")])
            print(f"{'':32s}  baseline median {b:.1f} s | baseline ratio {b / h:.3f} | "
                  f"platform / baseline {p / b:.3f}")
            print(f"{'':32s}  CPU: baseline median {bc:.1f} s | platform / baseline {pc / bc:.3f}")

if __name__ == "__main__":
    main()
