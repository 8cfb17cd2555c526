"""The Iceberg catalog and the control DB (one PostgreSQL server) stopped for 20 s at each commit
of a FIRST run into a fresh catalog (issue 40): bronze's publish (its first commit on main, in a
catalog that had no table before this run), its quarantine table's publish, silver's and gold's.
The run rides every outage out and completes; an independent reader (PyIceberg, a catalog of its
own) finds every row exactly once, every quarantined row once, gold's aggregate exact, and no
branch left behind.

One real `lakehouse run` process (its own JVM) meets all four outages, one after another, so the
whole test costs one cold run plus 4 x 20 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from tests import concurrency_kit as kit
from tests.fixtures.postgres import start_postgres

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

PIPELINE = "first"
META = """
pipelines:
  - {pipeline_id: first}
sources:
  - {source_id: first_raw, kind: files, format: jsonl, path: events, glob: "*.jsonl",
     columns: [{name: id, type: bigint}, {name: v, type: bigint}]}
targets:
  - {target_id: first_bronze, namespace: bronze, table: events, engine: arrow}
  - {target_id: first_silver, namespace: silver, table: events, write_mode: overwrite}
  - {target_id: first_gold, namespace: gold, table: totals, write_mode: overwrite}
stages:
  - {pipeline_id: first, stage_order: 1, stage_name: ingest, layer: bronze, source_id: first_raw,
     target_id: first_bronze, validation_set_id: first_rules}
  - {pipeline_id: first, stage_order: 2, stage_name: refine, layer: silver, target_id: first_silver,
     transformation: "SELECT id, v FROM bronze.events WHERE v >= 0"}
  - {pipeline_id: first, stage_order: 3, stage_name: total, layer: gold, target_id: first_gold,
     transformation: "SELECT COUNT(*) AS n, SUM(v) AS total FROM silver.events"}
validation_rules:
  - rule_set_id: first_rules
    rules:
      - {name: id_present, type: not_null, columns: [id], severity: warn, action: quarantine}
"""

#: each commit of the run: bronze's first (its table and branch created in the fresh catalog, while
#: the JVM `lakehouse run` warms up on a thread of its own initialises its catalog), bronze's
#: publish, its quarantine table's publish, silver's, gold's
COMMITS = ["before_batch@ingest", "before_publish@ingest", "between_publishes@ingest", "before_publish@refine",
           "before_publish@total"]
DOWN_S = 20.0


@pytest.fixture(scope="module")
def platform_pg():
    """A PostgreSQL server of its own, since the test stops it."""
    server, stop = start_postgres()
    yield server
    stop()


def test_outages_at_each_commit_of_a_first_run_are_ridden_out(platform_pg, tmp_path):
    pg = platform_pg
    home = tmp_path / "home"
    landing = home / "landing" / "events"
    landing.mkdir(parents=True)
    catalog_db, control_db = pg.create_database(), pg.create_database()
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": "lake",
           "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
           "LAKEHOUSE_CATALOG_URI": f"postgresql://{pg.host}:{pg.port}/{catalog_db}",
           "LAKEHOUSE_CATALOG_USER": pg.user, "LAKEHOUSE_CATALOG_PASSWORD": pg.password,
           "LAKEHOUSE_CONTROL_DB_URL": pg.sqlalchemy_url(control_db)}
    meta = tmp_path / "first.yaml"
    meta.write_text(META)
    MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(meta))
    good, bad = [], []
    for f in range(3):
        rows = [{"id": f * 100 + i, "v": f * 100 + i} for i in range(10)] + [{"id": None, "v": -1 - f}]
        good += [r for r in rows if r["id"] is not None]
        bad += [r["v"] for r in rows if r["id"] is None]
        (landing / f"part-{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    pause = tmp_path / "pause"
    pause.mkdir()
    run_env = kit.run_env(env, LAKEHOUSE_PAUSE_AT=",".join(COMMITS), LAKEHOUSE_PAUSE_DIR=str(pause))
    log = tmp_path / "run.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "lakehouse.cli", "run", PIPELINE], env=run_env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    runs = [(proc, log)]
    try:
        for point in COMMITS:
            deadline = time.monotonic() + 600
            while not list(pause.glob(f"{point}.*")):
                assert proc.poll() is None, f"ended before {point}:\n{log.read_text()[-6000:]}"
                assert time.monotonic() < deadline, f"the run never reached {point}"
                time.sleep(0.2)
            pg.stop_service()
            stopped = time.monotonic()
            (pause / f"release.{point}").touch()  # the run goes on into the outage
            time.sleep(max(0.0, DOWN_S - (time.monotonic() - stopped)))
            pg.start_service()
        (rc, out), = kit.wait_runs(runs, timeout=900)
    finally:
        kit.kill_all(runs)
        try:  # never leave the server stopped
            pg.connect().close()
        except Exception:  # noqa: BLE001
            pg.start_service()
    assert kit.succeeded(rc, out), out[-8000:]
    assert out.count("is reachable again") >= len(COMMITS), out[-8000:]  # it met every outage

    cat = SqlCatalog("lake", uri=pg.sqlalchemy_url(catalog_db), warehouse=env["LAKEHOUSE_WAREHOUSE"])
    ids = sorted(r["id"] for r in good)
    assert sorted(kit.counts(cat, "bronze.events", "id").elements()) == ids
    assert sorted(kit.counts(cat, "silver.events", "id").elements()) == ids
    assert sorted(kit.counts(cat, "bronze.events__quarantine", "v").elements()) == sorted(bad)
    gold = cat.load_table("gold.totals").scan().to_arrow().to_pylist()
    assert gold == [{"n": len(good), "total": sum(r["v"] for r in good)}]
    for ident in ("bronze.events", "bronze.events__quarantine", "silver.events", "gold.totals"):
        assert set(cat.load_table(ident).metadata.refs) == {"main"}, ident
