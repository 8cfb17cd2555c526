"""Production deployment, tested where it can be: Dagster on PostgreSQL storage with the shipped
deploy/dagster.yaml, the Iceberg catalog and the control DB on PostgreSQL, credentials only from
the environment."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.cli.demo import expected_daily, generate_user_events
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.settings import load_settings
from lakehouse.stage.runner import Platform
from lakehouse_assets.definitions import build_definitions, pipeline_job

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def production_env(settings, postgres_server, monkeypatch, tmp_path):
    """Dagster storage, Iceberg catalog and control DB in three databases of one PostgreSQL server."""
    pg = postgres_server
    dagster_db, catalog_db, control_db = (pg.create_database() for _ in range(3))
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    env = {
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_HOST": pg.host, "DAGSTER_PG_PORT": str(pg.port), "DAGSTER_PG_DB": dagster_db,
        "DAGSTER_PG_USERNAME": pg.user, "DAGSTER_PG_PASSWORD": pg.password,
        # the catalog URL carries no credentials: Spark (JDBC) and PyIceberg take them from these
        "LAKEHOUSE_CATALOG_URI": f"postgresql://{pg.host}:{pg.port}/{catalog_db}",
        "LAKEHOUSE_CATALOG_USER": pg.user, "LAKEHOUSE_CATALOG_PASSWORD": pg.password,
        "LAKEHOUSE_CONTROL_DB_URL": pg.sqlalchemy_url(control_db),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {"dagster_db": dagster_db, "catalog_db": catalog_db, "control_db": control_db, "home": home, **env}


def test_settings_derive_jdbc_url_without_credentials(production_env):
    s = load_settings()
    assert s.catalog_jdbc_url == (f"jdbc:postgresql://{production_env['DAGSTER_PG_HOST']}:"
                                  f"{production_env['DAGSTER_PG_PORT']}/{production_env['catalog_db']}")
    from lakehouse.runtime.spark import catalog_conf

    conf = catalog_conf(s)
    prefix = f"spark.sql.catalog.{s.catalog_name}"
    assert conf[f"{prefix}.jdbc.user"] == production_env["LAKEHOUSE_CATALOG_USER"]
    assert conf[f"{prefix}.jdbc.password"] == production_env["LAKEHOUSE_CATALOG_PASSWORD"]
    assert production_env["LAKEHOUSE_CATALOG_PASSWORD"] not in repr(s)
    from resources.spark import spark_resource

    # the Dagster resource config (shown in the UI) never carries the password
    assert production_env["LAKEHOUSE_CATALOG_PASSWORD"] not in json.dumps(spark_resource().spark_config)


def test_demo_pipeline_on_postgres_storage_and_catalog(production_env, spark, postgres_server):
    settings = load_settings()
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.spark()  # registers the PostgreSQL-backed catalog on the session's Spark
    platform.store.apply(load_metadata(REPO / "metadata" / "demo"))
    landing = settings.landing_dir / "user_events"
    generate_user_events(landing, rows=800, files=2, seed=5)

    instance = dg.DagsterInstance.get()  # from $DAGSTER_HOME/dagster.yaml = deploy/dagster.yaml
    try:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert instance.run_monitoring_settings["free_slots_after_run_end_seconds"] == 60

        from lakehouse.orchestration.instance import sync_pools

        sync_pools(platform, instance)
        limits = {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}
        assert limits["source:user_events_raw"] == 2 and limits["target:bronze_user_events"] == 1

        job = pipeline_job(build_definitions(platform), "user_events_etl")
        result = job.execute_in_process(instance=instance, raise_on_error=False)
        assert result.success
        run_id = result.run_id
    finally:
        instance.dispose()

    # the run, its events and its check results are in PostgreSQL, read with plain SQL
    conn = postgres_server.connect(production_env["dagster_db"])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
            assert cur.fetchone()[0] == "SUCCESS"
            cur.execute("SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
                        (run_id, "ASSET_MATERIALIZATION"))
            assert cur.fetchone()[0] == 3
            cur.execute("SELECT count(*) FROM asset_check_executions WHERE run_id = %s", (run_id,))
            assert cur.fetchone()[0] == 7
            cur.execute("SELECT count(*) FROM event_logs WHERE event LIKE %s",
                        ("%" + production_env["LAKEHOUSE_CATALOG_PASSWORD"] + "%",))
            assert cur.fetchone()[0] == 0, "a secret reached the event log"
    finally:
        conn.close()

    # the Iceberg catalog lives in PostgreSQL: an independent reader (PyIceberg) finds the tables there
    pg = postgres_server
    cat = SqlCatalog(settings.catalog_name,
                     uri=f"postgresql+psycopg2://{pg.user}:{pg.password}@{pg.host}:{pg.port}/{production_env['catalog_db']}",
                     warehouse=settings.warehouse)
    assert {"user_events"} <= {t[-1] for t in cat.list_tables("bronze")}
    gold = cat.load_table("gold.daily_user_events").scan().to_arrow().to_pylist()
    assert {str(r["event_date"]): (r["total_events"], r["unique_users"]) for r in gold} == expected_daily(landing)
    # ... and the control DB too (audit log of this run)
    events = {e.event for e in platform.store.audit_entries(run_id=run_id)}
    assert {"stage_started", "published"} <= events
