"""The Iceberg catalog and the control DB (one PostgreSQL server) stopped in the middle of a run.

Shorter than the outage window (default 60 s): the run waits, retries, and completes with every
row once. Longer than the window: the run fails with a message naming the database (host:port/db,
never a password) and what to do; nothing was published by the failed step, and the rerun — after
the database is back — loads every row once and leaves no branch behind. The JDBC source lives on
another server, which stays up: this is about the platform's own databases.
"""

from __future__ import annotations

import time

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from tests import concurrency_kit as kit
from tests.fixtures.postgres import start_postgres

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture(scope="module")
def platform_pg(tmp_path_factory):
    """A PostgreSQL server of its own, since the tests stop it."""
    server, stop = start_postgres()
    yield server
    stop()


@pytest.fixture
def lake(platform_pg, postgres_server, s3_server, tmp_path, lake_home, unique_ns):
    pg, src = platform_pg, postgres_server
    home = tmp_path / "home"
    home.mkdir()
    catalog_db, control_db, src_db = pg.create_database(), pg.create_database(), src.create_database()
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": "lake",
           "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
           "LAKEHOUSE_CATALOG_URI": f"postgresql://{pg.host}:{pg.port}/{catalog_db}",
           "LAKEHOUSE_CATALOG_USER": pg.user, "LAKEHOUSE_CATALOG_PASSWORD": pg.password,
           "LAKEHOUSE_CONTROL_DB_URL": pg.sqlalchemy_url(control_db),
           "LAKEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint_url,
           "CONC_SRC_USER": src.user, "CONC_SRC_PASSWORD": src.password,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    conn = src.connect(src_db)
    conn.autocommit = True
    kit.create_source_table(conn)
    bucket = s3_server.new_bucket("outage")

    class Lake:
        pass

    lk = Lake()
    lk.pg, lk.env, lk.home, lk.ns = pg, env, home, unique_ns
    lk.catalog_url = pg.sqlalchemy_url(catalog_db)
    lk.control_db = f"{pg.host}:{pg.port}/{control_db}"
    lk.expected = kit.Expected()

    def setup(settings: dict[str, str]) -> None:
        f = tmp_path / "conc.yaml"
        f.write_text(kit.metadata(unique_ns, bucket, src.jdbc_url(src_db), settings))
        MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(f))
        kit.land_files(home / "landing" / "events", "a", n_files=6, rows=20, expected=lk.expected)
        kit.put_s3(s3_server.client(), bucket, "a", n_files=4, rows=25, expected=lk.expected)
        kit.insert_rows(conn, 1, 120, lk.expected)

    lk.setup = setup
    yield lk
    conn.close()
    try:  # never leave the server stopped for the next test
        pg.connect().close()
    except Exception:  # noqa: BLE001
        pg.start_service()


def run_with_outages(lk, tmp_path, points: list[str], down_s: float, wait_for_exit: bool) -> tuple[int, str]:
    """One `lakehouse run`; each time it reaches one of `points` the database is stopped, the run
    goes on into the outage, and the database comes back after `down_s` (or, with
    `wait_for_exit`, only once the run has ended)."""
    pause = tmp_path / "pause"
    pause.mkdir()
    env = kit.run_env(lk.env, LAKEHOUSE_PAUSE_AT=",".join(points), LAKEHOUSE_PAUSE_DIR=str(pause))
    procs = kit.start_runs(1, env, tmp_path / "logs", tag="outage")
    proc, log = procs[0]
    try:
        for point in points:
            deadline = time.monotonic() + 900
            while not list(pause.glob(f"{point}.*")):
                assert proc.poll() is None, log.read_text()[-5000:]
                assert time.monotonic() < deadline, f"the run never reached {point}"
                time.sleep(0.2)
            lk.pg.stop_service()
            stopped = time.monotonic()
            (pause / f"release.{point}").touch()  # the run carries on into the outage
            if wait_for_exit:
                break
            time.sleep(max(0.0, down_s - (time.monotonic() - stopped)))
            lk.pg.start_service()
        results = kit.wait_runs(procs, timeout=1200)
        if wait_for_exit:
            lk.pg.start_service()
        return results[0]
    finally:
        kit.kill_all(procs)


def reader(lk) -> SqlCatalog:
    return SqlCatalog("lake", uri=lk.catalog_url, warehouse=lk.env["LAKEHOUSE_WAREHOUSE"])


@pytest.mark.timeout(1800)
def test_15s_outages_are_ridden_out_with_exact_counts(lake, tmp_path):
    """Two outages in one run: at the first publish (the JDBC stage: the publish lock, the
    compare-and-swap commit) and between two branch commits of the files stage (Spark's writes,
    the checkpoint table, the heartbeats)."""
    lake.setup({})
    rc, out = run_with_outages(lake, tmp_path, ["before_publish", "after_branch_commit"], down_s=15,
                               wait_for_exit=False)
    assert kit.succeeded(rc, out), out[-8000:]
    assert out.count("is reachable again") >= 2  # it did meet both outages before riding them out
    cat = reader(lake)
    assert kit.check_exactly_once(cat, lake.ns, lake.expected) == {}
    for ident in kit.TABLES.values():
        assert set(cat.load_table(ident.format(ns=lake.ns)).metadata.refs) == {"main"}


@pytest.mark.timeout(1800)
def test_an_outage_past_the_window_fails_clearly_and_the_rerun_is_exact(lake, tmp_path):
    lake.setup({"outage.window_seconds": "8"})
    rc, out = run_with_outages(lake, tmp_path, ["before_publish"], down_s=0, wait_for_exit=True)
    assert rc != 0 and "FAILURE" in out, out[-8000:]
    assert "outage window of 8s" in out and "re-run the step" in out
    assert "Iceberg catalog 127.0.0.1:" in out or f"control DB {lake.control_db}" in out
    assert lake.pg.password not in out
    # the database is back: the rerun loads exactly what the failed run did not publish
    results = kit.wait_runs(kit.start_runs(1, kit.run_env(lake.env), tmp_path / "logs", tag="rerun"), timeout=1200)
    rc, out = results[0]
    assert kit.succeeded(rc, out), out[-8000:]
    cat = reader(lake)
    assert kit.check_exactly_once(cat, lake.ns, lake.expected) == {}
    for ident in kit.TABLES.values():  # the failed run's branches were dropped by the rerun
        assert set(cat.load_table(ident.format(ns=lake.ns)).metadata.refs) == {"main"}
