"""entity_raw loads and a gold export on each engine: a fresh process per run, Spark / Arrow (issue 21).

    .venv/bin/python bench/bench_entity_raw_arrow.py                   # 3 rounds, 5 workflows x 4 records
    .venv/bin/python bench/bench_entity_raw_arrow.py --rounds 5 --records 4 --workflows 5

`entity_raw`: one `entity_raw.load` of `workflows` extraction files of `records` records each (the
common case: a few records per workflow), the application's `engine: spark` against `engine: arrow`.
`export`: a one-stage pipeline (a JSON-lines file of `export_rows` rows into a gold table) whose
target is exported to PostgreSQL (the tests' throwaway server), the target's `engine: spark`
against `engine: arrow`, so the Arrow side reads the published snapshot with PyIceberg and inserts
with parameterised statements. Each run is a fresh Python process in a fresh platform home, as a
Dagster run would be; sides alternate and the order flips each round. Printed per run: wall
seconds, CPU seconds of the process and of every process it started (the JVM included, read from
/proc before the process exits), and whether a JVM was started. Medians and the Spark / Arrow
ratios follow, with the load average (2 shared cores: judge by CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, resource, sys, time
t0 = time.monotonic()
import psutil
from lakehouse.metadata.loader import load_metadata
from lakehouse.platform import Platform

scenario, engine, n1, n2 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
platform = Platform.from_env()
home = platform.settings.home
if scenario == "entity_raw":
    import pyarrow as pa, pyarrow.parquet as pq
    from lakehouse.stage import entity_raw
    (home / "meta.yaml").write_text(f'''
sources:
  - {{source_id: app_extract, kind: files, format: parquet, path: extract, glob: "*.parquet",
     options: {{tenant_id: acme, connection_qualified_name: "default/postgres/1"}}}}
applications:
  - {{application_id: app, source_id: app_extract, engine: {engine}}}
''')
    platform.store.apply(load_metadata(home / "meta.yaml"))
    keys = []
    for w in range(n1):
        key = f"wf{w}/run1/raw/table/chunk-0.parquet"
        path = platform.settings.landing_dir / "extract" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"table_name": [f"t{i}" for i in range(n2)], "schema_name": ["public"] * n2,
                                 "columns": [[{"name": "id", "type": "int"}]] * n2, "rows": list(range(n2))}), path)
        keys.append(key)
    t1 = time.monotonic()
    res = entity_raw.load(platform, {"application": "app", "tenant_id": "acme", "file_keys": keys})
    ran, rows = res.engine, res.rows_written
else:
    from lakehouse.stage.runner import StageRunner
    (home / "meta.yaml").write_text(f'''
pipelines: [{{pipeline_id: p}}]
sources: [{{source_id: s, kind: files, format: jsonl, path: sales, glob: "*.jsonl"}}]
targets:
  - {{target_id: gold, namespace: gold, table: sales, engine: {engine}, export_target_id: wh}}
  - {{target_id: wh, kind: warehouse, jdbc_url: "{os.environ["BENCH_JDBC"]}", user_env: WH_USER,
     password_env: WH_PASSWORD, warehouse_table: "sales_{engine}"}}
stages: [{{pipeline_id: p, stage_order: 1, stage_name: load, layer: gold, source_id: s, target_id: gold}}]
''')
    platform.store.apply(load_metadata(home / "meta.yaml"))
    folder = platform.settings.landing_dir / "sales"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.jsonl").write_text("".join(json.dumps({"id": i, "region": f"r{i % 7}", "amount": i * 0.25,
                                                        "tags": {"n": i}}) + "\n" for i in range(n1)))
    t1 = time.monotonic()
    runner = StageRunner(platform, "p", "load", "bench")
    out = runner.load(runner.extract())
    ran, rows = f"{out.extra['engine']}/{out.extra['export_engine']}", out.extra["export_rows"]
t2 = time.monotonic()
me = psutil.Process()
kids = me.children(recursive=True)
cpu = sum(me.cpu_times()[:2])
for k in kids:
    try:
        cpu += sum(k.cpu_times()[:2])
    except psutil.Error:
        pass
jvm = any("java" in (k.name() or "") for k in kids)
print("RESULT " + json.dumps({"total_s": t2 - t0, "op_s": t2 - t1, "cpu_s": cpu, "jvm": jvm, "engine": ran,
                               "rows": rows}))
sys.stdout.flush()
os._exit(0)
"""


def one_run(scenario: str, engine: str, n1: int, n2: int, env_extra: dict[str, str]) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"bench_er_{scenario}_{engine}_"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env.update({"LAKEHOUSE_HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT), **env_extra})
    out = subprocess.run([sys.executable, "-c", CHILD, scenario, engine, str(n1), str(n2)], env=env,
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{scenario}/{engine} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workflows", type=int, default=5)
    ap.add_argument("--records", type=int, default=4)
    ap.add_argument("--export-rows", type=int, default=1000)
    ap.add_argument("--scenarios", nargs="+", default=["entity_raw", "export"])
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    env_extra: dict[str, str] = {}
    stop = None
    if "export" in args.scenarios:
        from tests.fixtures.postgres import start_postgres

        server, stop = start_postgres()
        db = server.create_database()
        env_extra = {"BENCH_JDBC": server.jdbc_url(db), "WH_USER": server.user, "WH_PASSWORD": server.password}
    try:
        results: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            for scenario in args.scenarios:
                n1, n2 = (args.workflows, args.records) if scenario == "entity_raw" else (args.export_rows, 0)
                for engine in (("spark", "arrow") if r % 2 == 0 else ("arrow", "spark")):
                    res = one_run(scenario, engine, n1, n2, env_extra)
                    results.setdefault((scenario, engine), []).append(res)
                    print(f"round {r + 1} {scenario:10s} {engine:5s} total {res['total_s']:6.2f}s op "
                          f"{res['op_s']:6.2f}s cpu {res['cpu_s']:6.2f}s jvm={res['jvm']} ran={res['engine']} "
                          f"rows={res['rows']} load={os.getloadavg()[0]:.1f}", flush=True)
        print(f"\nmedians over {args.rounds} rounds (load average now {os.getloadavg()[0]:.1f}):")
        print(f"{'scenario':10s} {'spark total':>11s} {'arrow total':>11s} {'ratio':>6s} {'spark cpu':>9s} "
              f"{'arrow cpu':>9s} {'ratio':>6s}")
        for scenario in args.scenarios:
            s, a = results[(scenario, "spark")], results[(scenario, "arrow")]
            st, at = statistics.median(x["total_s"] for x in s), statistics.median(x["total_s"] for x in a)
            sc, ac = statistics.median(x["cpu_s"] for x in s), statistics.median(x["cpu_s"] for x in a)
            print(f"{scenario:10s} {st:10.2f}s {at:10.2f}s {st / at:5.1f}x {sc:8.2f}s {ac:8.2f}s {sc / ac:5.1f}x")
    finally:
        if stop is not None:
            stop()


if __name__ == "__main__":
    t = time.monotonic()
    main()
    print(f"bench time {time.monotonic() - t:.0f}s")
