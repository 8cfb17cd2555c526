"""The whole demo pipeline end to end: `lakehouse run user_events_etl` vs a hand-written PySpark script.

    .venv/bin/python bench/bench_demo.py --rows 200000 --repeat 3

Both sides run as fresh processes (cold JVM) on a fresh catalog and warehouse each round, with the
same Spark settings (lakehouse.runtime.spark.spark_conf) over the same landed JSON lines (`lakehouse demo`):
  * platform:     `lakehouse run user_events_etl` on the demo metadata as shipped (three stages,
                  write-audit-publish on audit branches, rules as asset checks, quarantine, the
                  incremental silver merge and gold partitions, checkpoints, run summary); its
                  bronze target is `engine: auto`, so the ~32 MB landing is written by PyIceberg +
                  Arrow while the JVM starts, and silver and gold run on Spark;
  * allspark:     (`--all-spark`) the same metadata with the bronze target's `engine: auto`
                  replaced by `spark` (the other targets are on the built-in default, Spark): every
                  stage on Spark, as in the hand-written script, i.e. the platform's own overhead;
  * hand-written: a PySpark script doing the same three stages: the same JSON read (declared
                  schema, FAILFAST, `device` promoted, `_source_file` / `_ingested_at`), rows
                  without an id appended to the quarantine table, bronze appended; the same
                  de-duplicating silver SQL and the gold roll-up written to the same partition
                  specs; the same rules of each stage counted in Spark.
The sides alternate (the first side rotates per round); the ratio platform / hand-written of the
medians is printed for wall time and for CPU time of the whole process tree, the JVM included
(bench_ingest's `run`). `--jobs` records Spark's event log per run and prints how many Spark jobs
each side ran and its timeline (`spark_timeline`: process spawn to the Spark application's start,
time to the first job, JVM busy / idle between jobs, after the last job, application end to the
process tree's exit, executor task CPU): the JVM idle while the driver works is the platform's
overhead, the task CPU the data work both sides share. `--account` (implies `--jobs`) says whose
CPU it is: each process of the tree sampled from /proc every 0.1 s and read once more as a zombie
before it is reaped (the driver, the JVM, the driver's children: lineage forks, compute-log
`tail`s), split by the Spark timeline's phases (`@start` spawn to application start, `@to_job`
to the first job, `@jobs` to the last job's end, `@end` the rest), and the JVM's CPU per thread
name (JIT compilers, GC, executor tasks, py4j, the driver's Spark threads).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import PY, REPO, become_subreaper, demo_landing, run  # noqa: E402  (one copy of the timing helpers)

from lakehouse.runtime import procstat  # noqa: E402  (one /proc reader for benches and tests)

PIPELINE = "user_events_etl"

HANDWRITTEN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pyspark.sql import functions as F
    from lakehouse.settings import load_settings
    from lakehouse.runtime.spark import get_spark
    t0 = time.monotonic()
    spark = get_spark(load_settings(), app_name="handwritten")
    meta = Path(sys.argv[2])
    for ns in ("bronze", "silver", "gold"):
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{ns}")

    # bronze: the declared schema, FAILFAST, device promoted, lineage columns; rows without an id quarantined
    schema = ("event_id string, user_id bigint, event_type string, event_ts string, country string, "
              "context struct<device:string,app_version:string>")
    raw = (spark.read.schema(schema).option("mode", "FAILFAST").json(sys.argv[1] + "/*.jsonl")
           .withColumn("device", F.col("context.device"))
           .withColumn("_source_file", F.input_file_name()).withColumn("_ingested_at", F.current_timestamp()))
    rows, missing = raw.agg(F.count(F.lit(1)), F.count_if(F.col("event_id").isNull())).first()
    assert rows >= 1
    (raw.where("event_id IS NULL").withColumn("_failed_rules", F.array(F.lit("event_id_present")))
        .withColumn("_run_id", F.lit("hand")).withColumn("_quarantined_at", F.current_timestamp())
        .withColumn("_quarantine_id", F.expr("uuid()"))
        .writeTo("lake.bronze.user_events__quarantine").using("iceberg").createOrReplace())
    (raw.where("event_id IS NOT NULL").writeTo("lake.bronze.user_events").using("iceberg")
        .partitionedBy(F.col("event_type")).createOrReplace())

    # silver: the demo's SQL, its three rules counted, written by day sorted by user_id
    silver = spark.sql((meta / "sql" / "silver_user_events.sql").read_text().replace(
        "bronze.user_events", "lake.bronze.user_events"))
    spark.sql("CREATE TABLE lake.silver.user_events (event_id string, user_id bigint, event_type string, "
              "event_ts timestamp, country string, device string) USING iceberg PARTITIONED BY (days(event_ts))")
    spark.sql("ALTER TABLE lake.silver.user_events WRITE ORDERED BY user_id")
    silver.writeTo("lake.silver.user_events").append()
    s = spark.table("lake.silver.user_events")
    counts = s.agg(F.count(F.lit(1)) - F.countDistinct("event_id"),
                   F.count_if(~F.col("event_type").isin("view", "click", "purchase", "signup")),
                   F.count_if(F.col("user_id") < 1)).first()
    assert counts[0] == 0 and counts[1] == 0, counts

    # gold: the demo's roll-up, its two rules counted, by event_date
    gold = spark.sql((meta / "sql" / "gold_daily_user_events.sql").read_text().replace(
        "silver.user_events", "lake.silver.user_events"))
    gold.writeTo("lake.gold.daily_user_events").using("iceberg").partitionedBy(F.col("event_date")).createOrReplace()
    g = spark.table("lake.gold.daily_user_events")
    days, bad = g.agg(F.count(F.lit(1)), F.count_if(~F.expr("total_events >= unique_users"))).first()
    assert days >= 1 and bad == 0
    print("rows", rows, "quarantined", missing, "days", days, "seconds", round(time.monotonic() - t0, 2))
    """
)


def run_accounted(cmd: list[str], env: dict, cwd: Path = REPO, ok: tuple[int, ...] = (0,),
                  threads: dict[str, float] | None = None) -> tuple[float, float, dict[str, float], list[tuple[float, dict[str, float]]]]:
    """`run` with the CPU of each process of the tree: (wall, CPU of the tree, CPU per kind of
    process at its exit, the CPU per kind sampled every 0.1 s as (epoch seconds, {kind: CPU})).
    Kinds: `driver` (the command's own process), `jvm` (any java), `child:<comm>` for the rest (the
    lineage forks, compute-log `tail`s...). A process's last CPU is read from its zombie before it
    is reaped (waitid WNOWAIT), so short-lived children count in full when they are this process's
    own (orphans re-parented to this subreaper); grandchildren the driver reaps itself are sampled.
    `threads`, if given, is filled with the JVM's CPU per thread name (digits dropped) as last sampled."""
    me = os.getpid()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text: list[str] = []
    reader = threading.Thread(target=lambda: text.append(proc.stdout.read()), daemon=True)
    reader.start()
    last: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU)
    series: list[tuple[float, dict[str, float]]] = []
    tree = {proc.pid}
    by_tid: dict[tuple[int, str], tuple[str, float]] = {}

    def kind(pid: int, comm: str) -> str:
        return "driver" if pid == proc.pid else "jvm" if comm == "java" else f"child:{comm}"

    def sample() -> None:
        for pid, st in procstat.snapshot().items():
            ppid, comm, cpu = st.ppid, st.comm, st.cpu
            if pid in tree or ppid in tree or (ppid == me and pid != me):
                tree.add(pid)
                last[pid] = (kind(pid, comm), cpu)
                if comm == "java" and threads is not None:
                    for tid in procstat.threads(pid):
                        tst = procstat.read(pid, tid)
                        if tst is not None:  # a thread's last sampled CPU (pooled threads come and go)
                            by_tid[(pid, tid)] = (re.sub(r"[-#\s]*\d+$", "", tst.comm).strip(), tst.cpu)
        per: dict[str, float] = {}
        for k, c in last.values():
            per[k] = per.get(k, 0.0) + c
        series.append((time.time(), per))

    code = None
    while True:
        sample()
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is None:
            time.sleep(0.1)
            continue
        st = procstat.read(info.si_pid)  # the zombie's final CPU
        if st is not None:
            last[info.si_pid] = (kind(info.si_pid, st.comm), st.cpu)
        _, status = os.waitpid(info.si_pid, 0)
        if info.si_pid == proc.pid:
            code = os.waitstatus_to_exitcode(status)
            proc.returncode = code
            elapsed = time.monotonic() - t0
    reader.join(5)
    if threads is not None:
        for name, c in by_tid.values():
            threads[name] = threads.get(name, 0.0) + c
    sample()
    if code not in ok:
        sys.stderr.write("".join(text)[-6000:])
        raise SystemExit(f"command failed: {' '.join(cmd)}")
    per: dict[str, float] = {}
    for k, c in last.values():
        per[k] = per.get(k, 0.0) + c
    # the end of the run is when the tree's output closes, as `run` times it: the JVM's exit included
    elapsed = max(elapsed, time.monotonic() - t0 - 0.1)
    return elapsed, sum(per.values()), per, series


def cpu_at(series: list[tuple[float, dict[str, float]]], when: float) -> dict[str, float]:
    """The CPU per kind of process sampled last before `when` (epoch seconds)."""
    best: dict[str, float] = {}
    for t, per in series:
        if t > when:
            break
        best = per
    return best


def spark_marks(event_log: Path) -> dict[str, float]:
    """Epoch seconds of the application's start, its first job's start and its last job's end."""
    marks: dict[str, float] = {}
    starts, ends = [], []
    for f in event_log.rglob("*"):
        if not f.is_file():
            continue
        with f.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                head = line[:60]
                if '"SparkListenerApplicationStart"' in head:
                    marks["app_start"] = json.loads(line)["Timestamp"] / 1000
                elif '"SparkListenerJobStart"' in head:
                    starts.append(json.loads(line)["Submission Time"] / 1000)
                elif '"SparkListenerJobEnd"' in head:
                    ends.append(json.loads(line)["Completion Time"] / 1000)
    if starts:
        marks["first_job"] = min(starts)
    if ends:
        marks["last_job"] = max(ends)
    return marks


def account(per: dict[str, float], series: list[tuple[float, dict[str, float]]], marks: dict[str, float],
            spawned: float, ended: float) -> dict[str, float]:
    """CPU seconds per kind of process (driver, jvm, children together) at exit, and per phase:
    `<kind>@start` spawn to the application's start, `@to_job` to its first job, `@jobs` first job
    to last job's end, `@end` the rest."""
    def group(d: dict[str, float]) -> dict[str, float]:
        g = {"driver": d.get("driver", 0.0), "jvm": d.get("jvm", 0.0)}
        g["children"] = sum(v for k, v in d.items() if k.startswith("child:"))
        return g

    out = group(per)
    for k, v in per.items():
        if k.startswith("child:"):
            out[k] = v
    bounds = [("start", marks.get("app_start")), ("to_job", marks.get("first_job")), ("jobs", marks.get("last_job"))]
    prev = {k: 0.0 for k in ("driver", "jvm", "children")}
    for name, when in bounds:
        if when is None:
            return out
        now = group(cpu_at(series, when))
        for k in prev:
            out[f"{k}@{name}"] = now[k] - prev[k]
        prev = now
    final = group(per)
    for k in prev:
        out[f"{k}@end"] = final[k] - prev[k]
    return out


def spark_timeline(event_log: Path, spawned: float | None = None, ended: float | None = None) -> dict[str, float]:
    """Where a run's Spark time went, from its event log: the Spark jobs, seconds from the
    application's start to its first job (JVM start, then whatever the driver does before it),
    the first job's start to the last one's end split into `busy` (some job running) and `idle`
    (the JVM waits for the driver between jobs), the last job's end to the application's end,
    and the executors' task CPU (the data work itself, comparable between the sides). With the
    process's spawn and end (epoch seconds, as the bench saw them), also what lies outside the
    application: `to_app_start` (interpreter, imports, the driver's work before the JVM is
    asked for, the JVM's launch) and `app_end_to_exit` (the JVM's shutdown after the
    application ends, until the process tree's output pipes close)."""
    app = [0.0, 0.0]
    jobs: dict[int, list[float]] = {}
    task_cpu = 0.0
    wanted = ('"SparkListenerApplicationStart"', '"SparkListenerApplicationEnd"', '"SparkListenerJobStart"',
              '"SparkListenerJobEnd"', '"SparkListenerTaskEnd"')
    for f in event_log.rglob("*"):
        if not f.is_file():
            continue
        with f.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not any(w in line[:60] for w in wanted):
                    continue
                e = json.loads(line)
                kind = e["Event"]
                if kind == "SparkListenerApplicationStart":
                    app[0] = e["Timestamp"] / 1000
                elif kind == "SparkListenerApplicationEnd":
                    app[1] = e["Timestamp"] / 1000
                elif kind == "SparkListenerJobStart":
                    jobs[e["Job ID"]] = [e["Submission Time"] / 1000, e["Submission Time"] / 1000]
                elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
                    jobs[e["Job ID"]][1] = e["Completion Time"] / 1000
                else:
                    task_cpu += (e.get("Task Metrics") or {}).get("Executor CPU Time", 0) / 1e9
    out = {"jobs": float(len(jobs)), "task_cpu": task_cpu}
    if spawned is not None and app[0]:
        out["to_app_start"] = app[0] - spawned
    if ended is not None and app[1]:
        out["app_end_to_exit"] = max(ended - app[1], 0.0)
    if not jobs:
        return out
    spans = sorted(jobs.values())
    busy, end = 0.0, spans[0][0]
    for s, t in spans:  # the union of the jobs' intervals
        if t > end:
            busy += t - max(s, end)
            end = t
    out |= {"to_first_job": spans[0][0] - app[0], "busy": busy, "idle": end - spans[0][0] - busy,
            "after_last_job": max(app[1] - end, 0.0)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--jobs", action="store_true", help="each run's Spark jobs and timeline from its event log")
    ap.add_argument("--account", action="store_true",
                    help="CPU per process (driver, JVM, children) and per phase of the Spark timeline (implies --jobs)")
    ap.add_argument("--sides", default=None, help="comma-separated subset of platform,handwritten,allspark,baseline")
    ap.add_argument("--all-spark", action="store_true",
                    help="also time the platform with every stage on Spark (the demo's bronze engine: auto -> spark)")
    ap.add_argument("--baseline-repo", type=Path, default=None,
                    help="another checkout whose platform is timed in the same rounds (before/after a change)")
    args = ap.parse_args()
    args.jobs = args.jobs or args.account
    sides = ["platform", "handwritten"] + (["allspark"] if args.all_spark else []) + (
        ["baseline"] if args.baseline_repo else [])
    if args.sides:
        sides = [s for s in sides if s in args.sides.split(",")]
    jvm_threads: dict[str, float] = {}
    timer = (lambda *a, **k: run_accounted(*a, **k, threads=jvm_threads)) if args.account else run  # noqa: E731
    accounts: dict[str, list[dict[str, float]]] = {}
    if not become_subreaper():
        print("note: not a Linux child subreaper: CPU times leave out the JVMs")

    work = Path(tempfile.mkdtemp(prefix="bench_demo_"))
    landing = demo_landing(work, args.rows)
    meta = REPO / "metadata" / "demo"
    if args.all_spark:
        allspark_meta = work / "allspark_meta"
        shutil.copytree(meta, allspark_meta)
        yaml_file = allspark_meta / "user_events.yaml"
        text = yaml_file.read_text()
        if "engine: auto" not in text:
            raise SystemExit(f"--all-spark: no `engine: auto` in {yaml_file}: the demo changed, update this bench")
        yaml_file.write_text(text.replace("engine: auto", "engine: spark"))
    times: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    jobs: dict[str, list[dict[str, float]]] = {}
    try:
        for r in range(args.repeat):
            for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                home = work / f"{side}_{r}"
                home.mkdir(parents=True)
                env = {**os.environ, "LAKEHOUSE_HOME": str(home), "LAKEHOUSE_LANDING_DIR": str(landing)}
                env.pop("DAGSTER_HOME", None)
                if args.jobs:
                    (home / "events").mkdir()
                    env["LAKEHOUSE_SPARK_CONF__spark.eventLog.enabled"] = "true"
                    env["LAKEHOUSE_SPARK_CONF__spark.eventLog.dir"] = "file://" + str(home / "events")
                if side in ("platform", "allspark", "baseline"):
                    repo = args.baseline_repo.resolve() if side == "baseline" else REPO
                    if side == "baseline":  # its own lakehouse package, not this checkout's
                        env["PYTHONPATH"] = str(repo)
                    side_meta = allspark_meta if side == "allspark" else repo / "metadata" / "demo"
                    subprocess.run([PY, "-m", "lakehouse.cli", "metadata", "apply", str(side_meta)],
                                   env=env, check=True, cwd=repo, capture_output=True)
                    # quarantined rows are a success (exit 0); a baseline tree from before that convention
                    # said so with exit 3
                    spawned = time.time()
                    res = timer([PY, "-m", "lakehouse.cli", "run", PIPELINE], env=env, cwd=repo,
                                ok=(0,) if repo == REPO else (0, 3))
                else:
                    script = work / "hand.py"
                    script.write_text(HANDWRITTEN)
                    spawned = time.time()
                    env["PYTHONPATH"] = str(REPO)  # this checkout's lakehouse.runtime.spark, as the platform side's
                    res = timer([PY, str(script), str(landing / "user_events"), str(meta)], env=env)
                t, cpu = res[0], res[1]
                times.setdefault(side, []).append(t)
                cpus.setdefault(side, []).append(cpu)
                note = ""
                if args.jobs:
                    # the process ended when its output pipes closed (the JVM holds them too): spawn + wall
                    tl = spark_timeline(home / "events", spawned, spawned + t)
                    jobs.setdefault(side, []).append(tl)
                    note = f"  spark jobs {tl['jobs']:.0f}" + (
                        f" (to app start {tl.get('to_app_start', 0):.1f} s, to first {tl['to_first_job']:.1f} s, busy {tl['busy']:.1f} s, idle between jobs "
                        f"{tl['idle']:.1f} s, after last {tl['after_last_job']:.1f} s, app end to exit {tl.get('app_end_to_exit', 0):.1f} s, task CPU {tl['task_cpu']:.1f} s)"
                        if "busy" in tl else "")
                print(f"  round {r + 1} {side:11s} {t:7.1f} s  cpu {cpu:7.1f} s  load {os.getloadavg()[0]:.1f}{note}",
                      flush=True)
                if args.account:
                    acc = account(res[2], res[3], spark_marks(home / "events"), spawned, spawned + t)
                    accounts.setdefault(side, []).append(acc)
                    print("    CPU " + ", ".join(f"{k} {v:.1f}" for k, v in acc.items()), flush=True)
                    top = sorted(jvm_threads.items(), key=lambda kv: -kv[1])[:14]
                    print("    JVM CPU per thread name " + ", ".join(f"{k} {v:.1f}" for k, v in top), flush=True)
                    for k, v in jvm_threads.items():
                        accounts[side][-1][f"thread:{k}"] = v
                    jvm_threads.clear()
                if not args.keep:
                    shutil.rmtree(home, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    med = {s: statistics.median(v) for s, v in times.items()}
    cmed = {s: statistics.median(v) for s, v in cpus.items()}
    if {"platform", "handwritten"} <= med.keys():  # --sides may leave one out
        print(f"platform median {med['platform']:.1f} s | hand-written median {med['handwritten']:.1f} s | "
              f"ratio {med['platform'] / med['handwritten']:.3f} (goal <= 1.10)")
        print(f"CPU incl. JVM: platform median {cmed['platform']:.1f} s | hand-written median "
              f"{cmed['handwritten']:.1f} s | ratio {cmed['platform'] / cmed['handwritten']:.3f}")
        if "allspark" in med:
            print(f"all stages on Spark: median {med['allspark']:.1f} s | ratio to hand-written "
                  f"{med['allspark'] / med['handwritten']:.3f} (CPU {cmed['allspark'] / cmed['handwritten']:.3f})")
        if "baseline" in med:
            print(f"baseline median {med['baseline']:.1f} s (CPU {cmed['baseline']:.1f} s) | platform / baseline "
                  f"{med['platform'] / med['baseline']:.3f} (CPU {cmed['platform'] / cmed['baseline']:.3f})")
    if jobs:
        print("spark jobs per run:", json.dumps({k: [int(t["jobs"]) for t in v] for k, v in jobs.items()}))
        for side, tls in jobs.items():
            keys = [k for k in ("to_app_start", "to_first_job", "busy", "idle", "after_last_job", "app_end_to_exit",
                                "task_cpu") if all(k in t for t in tls)]
            print(f"{side} medians: " + ", ".join(f"{k} {statistics.median(t[k] for t in tls):.1f} s" for k in keys))
    for side, accs in accounts.items():
        keys = sorted({k for a in accs for k in a}, key=lambda k: (k.count("@"), k))
        print(f"{side} CPU medians: " + ", ".join(
            f"{k} {statistics.median(a.get(k, 0.0) for a in accs):.1f}" for k in keys))


if __name__ == "__main__":
    main()
