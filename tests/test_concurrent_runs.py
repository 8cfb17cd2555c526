"""Concurrent `lakehouse run` processes over the same new input: every run exits 0 and every row
lands once, for landing files (and their quarantined rows), S3 objects and an incremental JDBC
table, on the embedded SQLite catalog + control DB and on PostgreSQL. Rows are counted with
PyIceberg, independently of the platform.

Two runs with claims switched off are lined up at their first publish (every run planned and
wrote everything), so only the publish-time check stands between them and duplicates; four runs
use the claims as in production (they split the work instead of redoing it).
"""

from __future__ import annotations

import time

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from tests import concurrency_kit as kit

pytestmark = pytest.mark.slow


@pytest.fixture
def lake(request, tmp_path, lake_home, s3_server, postgres_server):
    """A fresh platform home for subprocess runs: catalog + control DB on `request.param`."""
    backend = request.param
    home = tmp_path / "home"
    home.mkdir()
    pg = postgres_server
    src_db = pg.create_database()
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": "lake",
           "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
           "LAKEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint_url,
           "CONC_SRC_USER": pg.user, "CONC_SRC_PASSWORD": pg.password,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    if backend == "postgres":
        catalog_db, control_db = pg.create_database(), pg.create_database()
        env.update({"LAKEHOUSE_CATALOG_URI": f"postgresql://{pg.host}:{pg.port}/{catalog_db}",
                    "LAKEHOUSE_CATALOG_USER": pg.user, "LAKEHOUSE_CATALOG_PASSWORD": pg.password,
                    "LAKEHOUSE_CONTROL_DB_URL": pg.sqlalchemy_url(control_db)})
        reader = SqlCatalog("lake", uri=pg.sqlalchemy_url(catalog_db), warehouse=env["LAKEHOUSE_WAREHOUSE"])
    else:
        env.update({"LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
                    "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}"})
        reader = None  # created after the runs made the catalog file
    conn = pg.connect(src_db)
    conn.autocommit = True
    kit.create_source_table(conn)

    class Lake:
        pass

    lk = Lake()
    lk.backend, lk.home, lk.env, lk.src, lk.bucket = backend, home, env, conn, s3_server.new_bucket("conc")
    lk.jdbc_url, lk.s3 = pg.jdbc_url(src_db), s3_server.client()
    lk.store = MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"])

    def catalog():
        return reader or SqlCatalog("lake", uri=env["LAKEHOUSE_CATALOG_URI"], warehouse=env["LAKEHOUSE_WAREHOUSE"])

    lk.catalog = catalog
    yield lk
    conn.close()


def apply(lk, tmp_path, ns: str, settings: dict[str, str]) -> None:
    f = tmp_path / "conc.yaml"
    f.write_text(kit.metadata(ns, lk.bucket, lk.jdbc_url, settings))
    lk.store.apply(load_metadata(f))


@pytest.mark.parametrize("lake,runs", [("sqlite", 2), ("sqlite", 4), ("postgres", 2), ("postgres", 4)],
                         indirect=["lake"], ids=["sqlite-2", "sqlite-4", "postgres-2", "postgres-4"])
@pytest.mark.timeout(2400)
def test_concurrent_runs_load_every_row_once(lake, runs, tmp_path, unique_ns):
    lined_up = runs == 2  # claims off, all lined up at their first publish: the publish check decides
    apply(lake, tmp_path, unique_ns, {"claims.enabled": "false"} if lined_up else {})
    expected = kit.Expected()
    kit.land_files(lake.home / "landing" / "events", "a", n_files=6, rows=20, expected=expected)
    kit.put_s3(lake.s3, lake.bucket, "a", n_files=4, rows=25, expected=expected)
    kit.insert_rows(lake.src, 1, 150, expected)

    pause = tmp_path / "pause"
    pause.mkdir()
    extra = {"LAKEHOUSE_PAUSE_AT": "before_publish", "LAKEHOUSE_PAUSE_DIR": str(pause)} if lined_up else {}
    t0 = time.monotonic()
    procs = kit.start_runs(runs, kit.run_env(lake.env, **extra), tmp_path / "logs")
    try:
        if lined_up:
            kit.release_when_paused(pause, procs, timeout=1200)
        results = kit.wait_runs(procs, timeout=1800)
    finally:
        kit.kill_all(procs)
    wall = time.monotonic() - t0
    for rc, out in results:
        assert kit.succeeded(rc, out), out[-6000:]

    cat = lake.catalog()
    assert kit.check_exactly_once(cat, unique_ns, expected) == {}
    for kind, ident in kit.TABLES.items():  # every audit branch was published or dropped
        assert set(cat.load_table(ident.format(ns=unique_ns)).metadata.refs) == {"main"}, kind
    taken = [e for e in lake.store.audit_entries(event="already_loaded", limit=10_000)]
    if lined_up:  # the first stage of each losing run found its input on main at publish
        assert len({e.run_id for e in taken}) >= runs - 1, [e.message for e in taken]
        assert all("already loaded by run" in e.message for e in taken)
    print(f"{lake.backend} x{runs}: {wall:.0f}s, {len(taken)} publish-time overlap(s)")
