"""1, 2 and 4 concurrent `lakehouse run` processes over the same new files: wall time and rows.

    .venv/bin/python bench/bench_concurrency.py --gb 0.5 --repeat 1

Each round starts from a fresh platform home (embedded SQLite catalog and control DB, or
`--postgres` for both on a PostgreSQL server started for the bench), lands nothing new, and starts
k runs of the same pipeline at the same moment over the same parquet files; the wall time is from
the start of the first to the exit of the last. Every run must exit 0; rows are counted with
PyIceberg (total and distinct event ids: duplicates = total - distinct). Prints each k's median
wall time, its ratio to the single run (goal: 4 runs <= 1.3x one run) and the duplicates (goal 0).
`--no-claims` switches plan-time claims off, so every run reads and writes every file and the
publish-time check alone keeps rows exactly once (the price of relying on it alone).
`--no-warmup` sets LAKEHOUSE_SPARK_WARMUP=0 for every run (the single one too): a run whose input
other runs claimed then never starts a JVM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PY = sys.executable

METADATA = """
pipelines:
  - {{pipeline_id: bench_conc}}
sources:
  - {{source_id: bench_files, kind: files, format: parquet, path: events, glob: "*.parquet", batch_files: 2,
     max_files_per_run: 100000, max_bytes_per_run: 1000000000000}}
targets:
  - {{target_id: bench_bronze, namespace: bronze, table: events, write_mode: append}}
stages:
  - {{pipeline_id: bench_conc, stage_order: 1, stage_name: ingest, layer: bronze, source_id: bench_files,
     target_id: bench_bronze}}
platform_settings:
  - {{setting_key: claims.enabled, setting_value: "{claims}"}}
"""


def main() -> None:
    from bench.bench_ingest import generate

    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=0.5)
    ap.add_argument("--runs", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--postgres", action="store_true", help="catalog and control DB on PostgreSQL")
    ap.add_argument("--no-claims", action="store_true")
    ap.add_argument("--no-warmup", action="store_true",
                    help="LAKEHOUSE_SPARK_WARMUP=0: a run starts its JVM only when a step needs it")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_conc_"))
    landing = work / "landing"
    size = generate(landing / "events", args.gb, 0)
    n_files = len(list((landing / "events").glob("*.parquet")))
    print(f"generated {size / 1024**3:.2f} GiB of parquet in {n_files} files; claims "
          f"{'off' if args.no_claims else 'on'}; catalog {'PostgreSQL' if args.postgres else 'SQLite'}; "
          f"JVM warm-up {'off' if args.no_warmup else 'on'}", flush=True)
    pg_stop = None
    if args.postgres:
        from tests.fixtures.postgres import start_postgres

        pg, pg_stop = start_postgres()
    times: dict[int, list[float]] = {}
    dups: dict[int, int] = {}
    try:
        for r in range(args.repeat):
            for k in (int(x) for x in args.runs.split(",")):
                home = work / f"home_{k}_{r}"
                home.mkdir()
                env = {key: v for key, v in os.environ.items() if not key.startswith("LAKEHOUSE_")}
                env.pop("DAGSTER_HOME", None)
                env.update({"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_LANDING_DIR": str(landing),
                            "PYTHONUNBUFFERED": "1",
                            "LAKEHOUSE_SPARK_WARMUP": "0" if args.no_warmup else "1"})
                if args.postgres:
                    cat_db, ctl_db = pg.create_database(), pg.create_database()
                    env.update({"LAKEHOUSE_CATALOG_URI": f"postgresql://{pg.host}:{pg.port}/{cat_db}",
                                "LAKEHOUSE_CATALOG_USER": pg.user, "LAKEHOUSE_CATALOG_PASSWORD": pg.password,
                                "LAKEHOUSE_CONTROL_DB_URL": pg.sqlalchemy_url(ctl_db)})
                meta = home / "meta.yaml"
                meta.write_text(METADATA.format(claims="false" if args.no_claims else "true"))
                subprocess.run([PY, "-m", "lakehouse.cli", "metadata", "apply", str(meta)], env=env, check=True,
                               cwd=REPO, capture_output=True)
                t0 = time.monotonic()
                procs = [subprocess.Popen([PY, "-m", "lakehouse.cli", "run", "bench_conc"], env=env, cwd=REPO,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                         for _ in range(k)]
                outs = [p.communicate()[0] for p in procs]
                wall = time.monotonic() - t0
                for p, out in zip(procs, outs, strict=True):
                    if p.returncode != 0:  # warnings exit 0 too (lakehouse.stage.run_summary)
                        sys.stderr.write(out[-4000:])
                        raise SystemExit(f"a run of the {k}-run round failed")
                total, distinct = count(env)
                times.setdefault(k, []).append(wall)
                dups[k] = dups.get(k, 0) + total - distinct
                print(f"  round {r + 1}: {k} run(s) {wall:7.1f} s  rows {total:,}  distinct {distinct:,}", flush=True)
                shutil.rmtree(home, ignore_errors=True)
    finally:
        if pg_stop:
            pg_stop()
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times[min(times)])
    print("runs | median wall (s) | ratio to 1 run | duplicate rows")
    for k in sorted(times):
        print(f"{k:4d} | {statistics.median(times[k]):15.1f} | {statistics.median(times[k]) / base:14.3f} | {dups[k]}")
    print("goal: 4 concurrent runs <= 1.3x one run, 0 duplicates")


def count(env: dict) -> tuple[int, int]:
    """Rows and distinct event ids, read with PyIceberg (not the platform)."""
    import pyarrow.compute as pc
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.engine import make_url

    home = Path(env["LAKEHOUSE_HOME"])
    uri = env.get("LAKEHOUSE_CATALOG_URI", f"sqlite:///{home / 'catalog.db'}")
    if uri.startswith("postgresql"):
        uri = make_url(uri.replace("postgresql://", "postgresql+psycopg2://")).set(
            username=env["LAKEHOUSE_CATALOG_USER"], password=env["LAKEHOUSE_CATALOG_PASSWORD"]
        ).render_as_string(hide_password=False)
    cat = SqlCatalog("lake", uri=uri, warehouse=f"file://{home / 'warehouse'}")
    ids = cat.load_table("bronze.events").scan(selected_fields=("event_id",)).to_arrow().column("event_id")
    return len(ids), len(pc.unique(ids))


if __name__ == "__main__":
    main()
