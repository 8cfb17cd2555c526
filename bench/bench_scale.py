"""Thousands of pipelines (issue 22): what each step costs at N = 1, 100, 1,000 pipelines, against N = 1.

The demo pipeline (3 stages, 7 rules, a landing-zone source) is copied N times; pipeline 0 is the
small pipeline that runs. For each N, in its own LAKEHOUSE_HOME:

  apply      `lakehouse metadata apply` of the N pipelines into an empty control DB (and `reapply`:
             the same after one SQL file changed, which derives one stage again)
  build      `build_definitions()` + `resolve_asset_graph()` in a fresh process (the issue's measure)
  codeserver what a code server does on (re)load: the whole repository (`load_all_definitions`) and
             its snapshot for the UI (`RepositorySnap.from_def(defer_snapshots=True)`); noted beside
             it, not timed in it: the asset job's snapshot (MB, config types, CPU) and what one
             client of a reload spends parsing both snapshots and hashing the job's (`cpu_client`)
  worker     what a launched run worker does before its first step: load the job of a run of
             pipeline 0 (the asset job with its stages selected, ReconstructableJob.get_definition)
  tick       one evaluation of the arrival sensor over the N sources (one new file in one of them)
  run        `lakehouse run <pipeline 0>` on a fresh 100-row file: the whole process, Spark included
  ui         (--ui) `dagster dev` on the home: start-up, a reload after an apply until the change is
             visible (with --locations K > 1: the workspace of K code locations, reloading pipeline 0's
             alone; the CPU of every process of dagster dev during it; their memory), and the render time of the global lineage page, the `silver` group page
             (N assets) and the asset catalog (4N+ assets) in headless Chromium

Timed steps run in fresh processes and are interleaved across N (round 1 of every N, then round
2, ...), so machine load falls on every N alike; each cell is the median wall time, with the CPU
time of the process in brackets (the CPU time moves less when other work shares the machine).

    .venv/bin/python bench/bench_scale.py                          # N = 1, 100, 1000; 3 rounds; no UI
    .venv/bin/python bench/bench_scale.py --sizes 1,1000 --ui      # with the browser
    .venv/bin/python bench/bench_scale.py --skip run --repeat 5    # without Spark
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from lakehouse.runtime import procstat  # noqa: E402  (one /proc reader for benches and tests)

PY = sys.executable
LAKEHOUSE = str(Path(PY).with_name("lakehouse"))
STEPS = ("apply", "reapply", "build", "codeserver", "worker", "tick", "run")
GOALS = {"build": "<= 5 s at N=1000", "worker": "run overhead <= 1.1x", "run": "<= 1.1x", "reload": "<= 10 s"}


# the asset keys of pipeline 0's stages (the demo's tables, suffixed): what a run of it selects
PIPELINE0_KEYS = json.dumps([["bronze", "user_events_0000"], ["silver", "user_events_0000"],
                             ["gold", "daily_user_events_0000"]])


def pipeline_id(i: int) -> str:
    return f"user_events_etl_{i:04d}"


def location_of(i: int, locations: int) -> str | None:
    """Pipeline i's code location, round-robin over `locations`: pipeline 0 (the one changed and
    reloaded) in the default one, which also holds what is not per pipeline: the heaviest."""
    k = i % locations
    return None if k == 0 else f"loc_{k:02d}"


def generate(out: Path, n: int, locations: int = 1) -> None:
    """The demo pipeline copied n times (same rules), SQL in one file per stage, over `locations`
    code locations."""
    demo = yaml.safe_load((REPO / "metadata" / "demo" / "user_events.yaml").read_text())
    silver = (REPO / "metadata" / "demo" / "sql" / "silver_user_events.sql").read_text()
    gold = (REPO / "metadata" / "demo" / "sql" / "gold_daily_user_events.sql").read_text()
    (out / "sql").mkdir(parents=True, exist_ok=True)
    doc: dict = {"pipelines": [], "sources": [], "targets": [], "stages": [],
                 "validation_rules": demo["validation_rules"], "retry_policies": demo["retry_policies"]}
    for i in range(n):
        s = f"{i:04d}"
        p = dict(demo["pipelines"][0], pipeline_id=pipeline_id(i))
        if location_of(i, locations):
            p["code_location"] = location_of(i, locations)
        src = dict(demo["sources"][0], source_id=f"user_events_raw_{s}", path=f"user_events_{s}")
        doc["pipelines"].append(p)
        doc["sources"].append(src)
        doc["targets"] += [dict(t, target_id=f"{t['target_id']}_{s}", table=f"{t['table']}_{s}")
                           for t in demo["targets"]]
        (out / "sql" / f"silver_{s}.sql").write_text(silver.replace("bronze.user_events", f"bronze.user_events_{s}"))
        (out / "sql" / f"gold_{s}.sql").write_text(gold.replace("silver.user_events", f"silver.user_events_{s}"))
        for st in demo["stages"]:
            row = dict(st, pipeline_id=p["pipeline_id"], target_id=f"{st['target_id']}_{s}")
            if "source_id" in row:
                row["source_id"] = src["source_id"]
            if "transformation_file" in row:
                row["transformation_file"] = f"sql/{'silver' if 'silver' in row['transformation_file'] else 'gold'}_{s}.sql"
            doc["stages"].append(row)
    (out / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def env_for(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_"))}
    env.update(LAKEHOUSE_HOME=str(home), DAGSTER_HOME=str(home / "dagster_home"), LAKEHOUSE_SPARK_MASTER="local[2]",
               LAKEHOUSE_SHUFFLE_PARTITIONS="2", PYTHONUNBUFFERED="1")
    return env


def timed(cmd: list[str], env: dict[str, str], timeout: float = 3600) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, stdout) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:  # lakehouse run: warnings exit 0 too
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


BUILD = """
import json, time
t0 = time.perf_counter(); c0 = time.process_time()
from lakehouse_assets.definitions import build_definitions
t1 = time.perf_counter(); c1 = time.process_time()
graph = build_definitions().resolve_asset_graph()
t2 = time.perf_counter(); c2 = time.process_time()
print(json.dumps({"wall": t2 - t1, "cpu": c2 - c1, "import": t1 - t0, "assets": len(graph.get_all_asset_keys())}))
"""

CODESERVER = """
import json, time
t0 = time.perf_counter(); c0 = time.process_time()
from dagster._core.remote_representation.external_data import JobDataSnap, RepositorySnap
from dagster._serdes import deserialize_value, serialize_value
from lakehouse_assets.definitions import defs
c1 = time.process_time()
defs.load_all_definitions()
c2 = time.process_time()
snap = RepositorySnap.from_def(defs, defer_snapshots=True)  # mostly every job's snapshot id
c3 = time.process_time()
snap = serialize_value(snap)
c4, wall = time.process_time(), time.perf_counter() - t0  # the step's time, as before: up to here
# the implicit asset job's snapshot, as the code server sends it (ExternalJob), and what a client of a
# reload does with both replies: parse them and hash the job's snapshot (its id)
job = JobDataSnap.from_job_def(defs.get_job("__ASSET_JOB"), include_parent_snapshot=True)
job_text = serialize_value(job)
c5 = time.process_time()
deserialize_value(snap, RepositorySnap)
job_id = deserialize_value(job_text, JobDataSnap).job.snapshot_id
print(json.dumps({"wall": wall, "cpu": c4 - c0, "mb": len(snap) / 1e6,
                  "jobs": len(defs.job_names), "cpu_import": c1 - c0, "cpu_load": c2 - c1, "cpu_snapshot": c3 - c2,
                  "cpu_serialize": c4 - c3, "job_mb": len(job_text) / 1e6, "cpu_job_snapshot": c5 - c4,
                  "job_config_types": len(job.job.config_schema_snapshot.all_config_snaps_by_key),
                  "cpu_client": time.process_time() - c5}))
"""

WORKER = """
import json, sys, time
t0 = time.perf_counter(); c0 = time.process_time()
import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableRepository
from lakehouse_assets.factory import PIPELINES_JOB
repo = ReconstructableRepository.for_module("lakehouse_assets.definitions", "defs", working_directory=sys.argv[2])
keys = {dg.AssetKey(p) for p in json.loads(sys.argv[1])}  # a run of pipeline 0: the asset job, its stages selected
# as dagster._grpc.impl.core_execute_run does: the job by name first (the early check), in the frame
# holding the run, then the run's subset
dagster_run = dg.DagsterRun(job_name=PIPELINES_JOB, asset_selection=frozenset(keys))
recon = repo.get_reconstructable_job(PIPELINES_JOB)
recon.get_definition()
job = recon.get_subset(asset_selection=dagster_run.asset_selection).get_definition()
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "assets": len(job.asset_layer.selected_asset_keys)}))
"""

TICK = """
import json, sys, time
from pathlib import Path
import dagster as dg
from lakehouse.cli.demo import generate_user_events
from lakehouse_assets.definitions import build_definitions
from lakehouse.stage.runner import Platform
from sensors.arrivals import SENSOR_NAME
defs = build_definitions()
sensor = defs.get_sensor_def(SENSOR_NAME)
instance = dg.DagsterInstance.ephemeral()
def tick(cursor):
    t0 = time.perf_counter(); c0 = time.process_time()
    r = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
    return r, time.perf_counter() - t0, time.process_time() - c0
first, _, _ = tick(None)  # the first tick observes every source once
landing = Platform.from_env().settings.landing_dir / "user_events_0000" / f"tick_{time.time_ns()}"
generate_user_events(landing, rows=10, files=1, seed=3)
second, wall, cpu = tick(first.cursor)
print(json.dumps({"wall": wall, "cpu": cpu, "runs": len(second.run_requests),
                  "observations": len(second.asset_events or [])}))
"""


def child_json(code: str, env: dict[str, str], *args: str) -> dict:
    _, _, out = timed([PY, "-c", code, *args], env)
    return json.loads(out.strip().splitlines()[-1])


def prepare(work: Path, n: int, locations: int = 1) -> tuple[Path, Path, dict]:
    home = work / f"n{n}"
    meta = home / "metadata"
    generate(meta, n, locations)
    (home / "dagster_home").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "deploy" / "dagster.dev.yaml", home / "dagster_home" / "dagster.yaml")
    for i in range(n):  # every landing zone exists (the tick lists them all)
        (home / "landing" / f"user_events_{i:04d}").mkdir(parents=True, exist_ok=True)
    return home, meta, env_for(home)


def apply_step(meta: Path, env: dict) -> tuple[float, float]:
    wall, cpu, _ = timed([LAKEHOUSE, "metadata", "apply", str(meta)], env)
    return wall, cpu


def reapply_step(meta: Path, env: dict, k: int) -> tuple[float, float]:
    """Change one SQL file (pipeline 0's silver filter) and apply again: one stage derived again."""
    f = meta / "sql" / "silver_0000.sql"
    f.write_text(f.read_text().split("\n-- edit")[0] + f"\n-- edit {k}\n")
    wall, cpu, out = timed([LAKEHOUSE, "metadata", "apply", str(meta)], env)
    assert "derived: 1 stage(s)" in out, out
    return wall, cpu


def run_step(home: Path, env: dict, k: int) -> tuple[float, float]:
    from lakehouse.cli.demo import generate_user_events

    generate_user_events(home / "landing" / "user_events_0000" / f"run_{k}", rows=100, files=1, seed=100 + k)
    wall, cpu, _ = timed([LAKEHOUSE, "run", pipeline_id(0)], env)
    return wall, cpu


def fmt(vals: list[tuple[float, float]]) -> str:
    if not vals:
        return "—"
    return f"{statistics.median(v[0] for v in vals):.2f} s ({statistics.median(v[1] for v in vals):.2f})"


def ratio(vals: list[tuple[float, float]], base: list[tuple[float, float]]) -> str:
    if not vals or not base:
        return "—"
    w = statistics.median(v[0] for v in vals) / statistics.median(v[0] for v in base)
    c = statistics.median(v[1] for v in vals) / statistics.median(v[1] for v in base)
    return f"{w:.2f}x ({c:.2f}x)"


def group_usage(pgid: int) -> tuple[dict[int, float], float]:
    """({pid: CPU s}, RSS MB) of the live processes of a process group (dagster dev: the webserver, the
    daemon, the code servers), from /proc."""
    page = os.sysconf("SC_PAGE_SIZE")
    cpu: dict[int, float] = {}
    rss = 0.0
    for pid, st in procstat.snapshot().items():
        if st.pgrp != pgid:
            continue
        try:  # statm's resident set is exact (stat's is the kernel's cached per-CPU count)
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page / 2**20
        except (OSError, IndexError, ValueError):
            continue
        cpu[pid] = st.cpu
    return cpu, rss


def ui_step(home: Path, env: dict, n: int, page_timeout: int = 600, locations: int = 1) -> dict[str, float]:
    """dagster dev on the home: start-up, reload after an apply, page renders in headless Chromium.
    With several code locations: the workspace `lakehouse workspace` writes, and the reload of pipeline
    0's location only (what `metadata apply` reports as changed)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    from tests.fixtures.dagster_dev import CHROMIUM, CHROMIUM_ARGS, _wait_ready, free_port, stop_process_group

    out: dict[str, float] = {}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    trace = home / "defs_trace.jsonl"  # one line per definitions build, by process (definitions._trace)
    env = dict(env, LAKEHOUSE_DEFS_TRACE=str(trace))
    log = (home / "dagster_dev.log").open("w")
    workspace = REPO / "workspace.yaml"
    if locations > 1:
        workspace = home / "workspace.yaml"
        print("  " + timed([LAKEHOUSE, "workspace", "--output", str(workspace)], env)[2].strip()[:300], flush=True)
    where = "lakehouse"  # pipeline 0's location (location_of)
    t0 = time.monotonic()
    proc = subprocess.Popen([str(Path(PY).with_name("dagster")), "dev", "-w", str(workspace),
                             "-h", "127.0.0.1", "-p", str(port)], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(url, proc, home / "dagster_dev.log", timeout=1800)
        out["ui start"] = time.monotonic() - t0

        def gql(query: str, variables: dict | None = None) -> dict:
            import urllib.request

            req = urllib.request.Request(f"{url}/graphql", json.dumps({"query": query, "variables": variables or {}})
                                         .encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as resp:
                return json.loads(resp.read())["data"]

        gql("mutation { setNuxSeen }")
        # a change an operator makes: pipeline 0's silver stage gets a new description; apply; reload
        marker = f"described at {time.time_ns()}"
        meta = home / "metadata" / "pipelines.yaml"
        doc = yaml.safe_load(meta.read_text())
        next(s for s in doc["stages"] if s["pipeline_id"] == pipeline_id(0) and s["layer"] == "silver")[
            "description"] = marker
        meta.write_text(yaml.safe_dump(doc, sort_keys=False))
        applied = timed([LAKEHOUSE, "metadata", "apply", str(meta)], env)[2]
        print("  " + next((line for line in applied.splitlines() if "code locations" in line), "?"), flush=True)
        cpu0, rss0 = group_usage(proc.pid)
        out["memory before reload (MB)"], out["processes"] = rss0, len(cpu0)
        t1, t1_clock = time.monotonic(), time.time()
        gql("mutation($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename } }",
            {"name": where})
        mutation = time.monotonic() - t1  # the mutation returns once the code server has reloaded
        query = ('{ assetNodeOrError(assetKey: {path: ["silver", "user_events_0000"]}) '
                 '{ ... on AssetNode { description } } }')
        while marker not in (gql(query)["assetNodeOrError"] or {}).get("description", ""):
            if time.monotonic() - t1 > 1800:
                raise TimeoutError("the reload never showed the change")
            time.sleep(0.5)
        out["reload"] = time.monotonic() - t1
        cpu1, _ = group_usage(proc.pid)
        # what each process alive now spent since the reload began (the old code server, gone, is not counted)
        spent = {pid: c - cpu0.get(pid, 0.0) for pid, c in cpu1.items()}
        out["reload CPU, all processes"] = sum(spent.values())

        def what(pid: int) -> str:
            argv = procstat.cmdline(pid)
            if argv is None:
                return "?"
            return " ".join(Path(a).name if i == 0 else a for i, a in enumerate(argv[:4]) if a)[:60]

        print("  reload CPU by process: " + ", ".join(f"{what(pid)} ({'new' if pid not in cpu0 else pid}) {c:.1f} s"
                                                      for pid, c in sorted(spent.items(), key=lambda x: -x[1])
                                                      if c >= 0.1), flush=True)
        out["reload mutation"] = mutation
        builds = [json.loads(line) for line in trace.read_text().splitlines()]
        whole = [b for b in builds if b["pipelines"] is None]
        # the reload's split: the new code server's build ends (its trace line) before it answers at all
        after = [b for b in whole if b.get("ended", 0) > t1_clock]
        if after:
            out["reload: new code server built"] = after[0]["ended"] - t1_clock
            out["reload: its build"] = after[0]["seconds"]
        print(f"  ui N={n}: whole-graph builds since start, by process: "
              + ", ".join(f"pid {b['pid']} {b['seconds']:.1f} s" for b in whole), flush=True)
        # the group holds every silver asset (the page draws the ones in view): counted from the API
        count = len({tuple(a["assetKey"]["path"]) for a in gql('{ assetNodes { assetKey { path } } }')["assetNodes"]
                     if a["assetKey"]["path"][0] == "silver"})
        if count != n:
            raise RuntimeError(f"the silver group holds {count} assets, not {n}")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
            page.set_default_timeout(page_timeout * 1000)
            # (page, what shows it rendered). The group's lineage canvas draws only the nodes in view
            # and opens centred on the middle of the graph (user_events_0500 of 1,000), so it is
            # rendered when any silver node's label is visible — not user_events_0000, which is off
            # screen; the group's list view lists them in order, user_events_0000 first; the catalog
            # lists `layer / table` links, bronze first.
            node = re.compile(r"^user_events_\d{4}$")
            pages = {"lineage page": ("/asset-groups", page.get_by_text("silver", exact=True)),
                     "silver group page": ("/locations/lakehouse/asset-groups/silver", page.get_by_text(node)),
                     "silver group list": ("/locations/lakehouse/asset-groups/silver/list",
                                           page.get_by_text("silver / user_events_0000", exact=True)),
                     "asset catalog": ("/assets", page.locator('a[href$="/assets/bronze/user_events_0000"]'))}
            for name, (path, text) in pages.items():
                t2 = time.monotonic()
                try:
                    page.goto(url + path)
                    text.first.wait_for(state="visible")
                    out[name] = time.monotonic() - t2
                    if name == "silver group page":
                        labels = page.evaluate("() => [...document.querySelectorAll('*')].filter(e => "
                                               "e.children.length === 0 && /^user_events_\\d{4}$/.test("
                                               "e.textContent)).map(e => e.textContent)")
                        print(f"  ui N={n}: silver group page drew {len(set(labels))} of {n} nodes in view "
                              f"({', '.join(sorted(set(labels))[:3])} …)", flush=True)
                except PlaywrightTimeout:  # said, with what the page showed, instead of a lost bench
                    shot = Path(tempfile.gettempdir()) / f"bench_scale_n{n}_{name.replace(' ', '_')}.png"  # kept
                    page.screenshot(path=str(shot))
                    print(f"  ui N={n}: {name}: {text} not visible after {page_timeout} s; screenshot {shot}",
                          flush=True)
                    out[name] = float("nan")
            browser.close()
    finally:
        stop_process_group(proc)
        log.close()
    return out


def unit(key: str) -> str:
    return "" if "(MB)" in key or key == "processes" else " s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,100,1000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", default="", help=f"comma-separated steps to leave out, of {', '.join(STEPS)}")
    ap.add_argument("--ui", action="store_true", help="also time dagster dev and the pages in headless Chromium")
    ap.add_argument("--locations", type=int, default=None,
                    help="code locations the pipelines are spread over, round-robin (default with --ui: 10 at "
                         "N >= 1000, else 1; 1 is the single location of before)")
    ap.add_argument("--page-timeout", type=int, default=600, help="seconds a UI page may take to show its asset")
    ap.add_argument("--keep", action="store_true", help="keep the homes (printed) for a look afterwards")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    skip = {s for s in args.skip.split(",") if s}
    work = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    res: dict[tuple[str, int], list[tuple[float, float]]] = {}
    notes: dict[int, dict] = {}
    try:
        homes = {}
        locs = {n: args.locations or (10 if args.ui and n >= 1000 else 1) for n in sizes}
        for n in sizes:
            homes[n] = prepare(work, n, locs[n])
            home, meta, env = homes[n]
            print(f"N={n}: {n} pipelines, {4 * n} assets in {locs[n]} code location(s) under {home}", flush=True)
            res[("apply", n)] = [apply_step(meta, env)]  # into an empty control DB: once
            print(f"  apply {fmt(res[('apply', n)])}", flush=True)
        for r in range(args.repeat):
            for n in sizes:
                home, meta, env = homes[n]
                row = []
                if "reapply" not in skip:
                    res.setdefault(("reapply", n), []).append(reapply_step(meta, env, r))
                    row.append(f"reapply {fmt(res[('reapply', n)][-1:])}")
                for step, code, extra in (("build", BUILD, ()), ("codeserver", CODESERVER, ()),
                                          ("worker", WORKER, (PIPELINE0_KEYS, str(REPO))),
                                          ("tick", TICK, ())):
                    if step in skip:
                        continue
                    d = child_json(code, env, *extra)
                    res.setdefault((step, n), []).append((d["wall"], d["cpu"]))
                    notes.setdefault(n, {}).update({f"{step}_{k}": v for k, v in d.items() if k not in ("wall", "cpu")})
                    row.append(f"{step} {d['wall']:.2f} s ({d['cpu']:.2f})")
                if "run" not in skip:
                    res.setdefault(("run", n), []).append(run_step(home, env, r))
                    row.append(f"run {fmt(res[('run', n)][-1:])}")
                print(f"  round {r + 1} N={n}: " + ", ".join(row), flush=True)
        ui: dict[int, dict[str, float]] = {}
        if args.ui:
            for n in sizes:
                home, _, env = homes[n]
                ui[n] = ui_step(home, env, n, args.page_timeout, locs[n])
                print(f"  ui N={n}: " + ", ".join(f"{k} {v:.1f}{unit(k)}" for k, v in ui[n].items()), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"homes kept under {work}")
    base = sizes[0]
    print(f"\nmedian wall time (CPU time of the process), and the ratio against N={base}")
    head = "| step | " + " | ".join(f"N={n}" for n in sizes) + " | " + " | ".join(
        f"N={n} / N={base}" for n in sizes[1:]) + " | goal |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for step in STEPS:
        if (step, base) not in res:
            continue
        cells = [fmt(res.get((step, n), [])) for n in sizes]
        ratios = [ratio(res.get((step, n), []), res[(step, base)]) for n in sizes[1:]]
        print(f"| {step} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {GOALS.get(step, '')} |")
    for key in ("reload", "reload mutation", "reload: new code server built", "reload: its build",
                "reload CPU, all processes", "memory before reload (MB)", "processes", "ui start", "lineage page",
                "silver group page", "silver group list", "asset catalog"):
        if ui:
            print(f"| {key} | " + " | ".join(f"{ui[n].get(key, float('nan')):.1f}{unit(key)}" for n in sizes) + " | "
                  + " | ".join("" for _ in sizes[1:]) + f" | {GOALS.get(key, '')} |")
    for n, d in notes.items():
        print(f"N={n}: " + ", ".join(f"{k}={v if not isinstance(v, float) else round(v, 2)}" for k, v in d.items()))


if __name__ == "__main__":
    main()
