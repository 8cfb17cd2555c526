"""The code location: `dagster dev` loads `defs` from here (see [tool.dagster] and workspace.yaml)."""

from __future__ import annotations

import logging
import os

import dagster as dg

from lakehouse.entity_raw import ensure_tables_at_startup
from lakehouse.metadata.loader import load_metadata
from lakehouse.runner import Platform
from lakehouse_assets.dashboard import dashboard_definitions
from lakehouse_assets.entity_raw_assets import entity_raw_definitions
from lakehouse_assets.factory import build_assets, pipeline_jobs
from lakehouse_assets.run_summary import build_run_summary_sensor
from resources import IcebergIOManager, LakehouseResource, spark_resource
from schedules import build_schedules
from sensors import build_sensors

log = logging.getLogger(__name__)


def bootstrap_if_empty(platform: Platform) -> None:
    """First start on the embedded defaults: load the demo metadata so the UI is not empty."""
    if os.environ.get("LAKEHOUSE_AUTO_APPLY", "1") == "0":
        return
    catalog = platform.store.load()
    if catalog.pipelines or not platform.settings.metadata_dir.exists():
        return
    log.warning("control DB is empty: applying %s", platform.settings.metadata_dir)
    platform.store.apply(load_metadata(platform.settings.metadata_dir))


def build_definitions(platform: Platform | None = None) -> dg.Definitions:
    """Structural metadata (pipelines, stages, sources, targets, rule sets) builds the graph."""
    platform = platform or Platform.from_env()
    bootstrap_if_empty(platform)
    catalog = platform.store.load()
    dashboard = dashboard_definitions()
    ensure_tables_at_startup(platform)  # entity_raw.<app> for every registered application
    raw = entity_raw_definitions(catalog)
    return dg.Definitions(
        assets=[*build_assets(catalog), *dashboard["assets"], *raw["assets"]],
        jobs=[*pipeline_jobs(catalog), *dashboard["jobs"], *raw["jobs"]],
        sensors=[*build_sensors(catalog), *dashboard["sensors"], *raw["sensors"], build_run_summary_sensor()],
        schedules=[*build_schedules(catalog), *raw["schedules"]],
        resources={
            "lakehouse": LakehouseResource(),
            "iceberg_io_manager": IcebergIOManager(),
            "pyspark": spark_resource(),
        },
        # One process per run, so one JVM per run: every asset of the run shares the SparkSession.
        executor=dg.in_process_executor,
    )


defs = build_definitions()
