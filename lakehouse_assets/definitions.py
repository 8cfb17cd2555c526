"""The code location: `dagster dev` loads `defs` from here (see [tool.dagster] and workspace.yaml).

Importing this module reads, writes and connects to nothing. `defs` is a repository whose members
are built from the control DB when Dagster first asks for them, in one read of the structural
metadata and of what `lakehouse metadata apply` derived from it (no SQL parsing, no writes):

* the code server (the UI, sensors, schedules) asks for everything and gets the whole graph;
* a run worker (`dagster api execute_run`, a run launched from the UI, a sensor or a schedule)
  loads the same repository and builds the whole graph of its code location too: a pipeline's run
  is Dagster's implicit asset job with the pipeline's stage assets selected (there is no job per
  pipeline). What a run pays grows with its code location; splitting pipelines into code locations
  (`Pipeline.code_location`, `lakehouse workspace`) is the scaling path.

Only Dagster's public API is used: a lazy `dg.RepositoryData` (documented for "lazy creation of
repository members"), `dg.repository`, `dg.Definitions`.

Setting up the embedded defaults (demo metadata, entity_raw tables) is `lakehouse metadata apply`'s
job (scripts/up.sh), not this module's.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import threading
import time
from collections.abc import Iterable

import dagster as dg

from lakehouse.metadata.assets import PIPELINE_TAG
from lakehouse.metadata.derived import read_structure
from lakehouse.metadata.model import DEFAULT_CODE_LOCATION, check_ident
from lakehouse.settings import DagsterSettings, current
from lakehouse.stage.runner import Platform
from lakehouse_assets.dashboard import dashboard_definitions
from lakehouse_assets.entity_raw_assets import entity_raw_definitions
from lakehouse_assets.factory import Graph, build_source_specs, build_stage_assets, upstream_specs
from lakehouse_assets.maintenance_assets import maintenance_definitions
from lakehouse_assets.run_summary import build_run_summary_sensor
from resources import IcebergIOManager, LakehouseResource, spark_resource
from schedules import build_schedules
from sensors import build_sensors

log = logging.getLogger(__name__)
REPOSITORY_NAME = "__repository__"  # the name dg.Definitions gives its repository: runs find it under it


def _resources() -> dict:
    """Settings reach Dagster through `lakehouse` alone; Spark and the IO manager are built from it."""
    lakehouse = LakehouseResource.from_settings()
    pyspark = spark_resource(lakehouse)
    return {"lakehouse": lakehouse, "pyspark": pyspark,
            "iceberg_io_manager": IcebergIOManager(lakehouse=lakehouse, pyspark=pyspark)}


@contextlib.contextmanager
def _no_cyclic_gc():
    """Building thousands of definitions allocates millions of objects that all stay alive; the
    cyclic collector, triggered by the allocations, would traverse them again and again (about
    40% of the build's time at 4,000 assets). Reference counting still frees what is dropped."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def build_definitions(platform: Platform | None = None, *, pipelines: Iterable[str] | None = None,
                      location: str | None = None) -> dg.Definitions:
    """Structural metadata (pipelines, stages, sources, targets) and the rows apply derived build
    the graph. `pipelines`: only these pipelines' stage assets (a run's build: no sensors,
    schedules or other assets); a run of them is the implicit asset job with their assets selected.
    `location`: one code location's definitions (`Pipeline.code_location`): its pipelines' stage
    assets, sources, arrivals and schedules, the tables they read from other locations as external
    specs; the default location also holds what is not per pipeline (dashboard, entity_raw,
    maintenance, the platform's sensors). None, or the default location when no pipeline names
    another: everything, as before locations existed."""
    started = time.monotonic()
    with _no_cyclic_gc():
        defs = _build(platform or LakehouseResource.from_settings().platform(), pipelines, location)
        # cached: the repository and its asset graph (which every user of the definitions asks for),
        # built here without the collector
        defs.resolve_asset_graph()
    _trace(pipelines, defs, time.monotonic() - started, location)
    return defs


def _trace(pipelines: Iterable[str] | None, defs: dg.Definitions, seconds: float, location: str | None = None) -> None:
    """LAKEHOUSE_DEFS_TRACE=<file>: one JSON line per build (process, what was built, how long): how an
    operator, the bench and the tests see what a code server or a run worker built."""
    path = current(DagsterSettings).defs_trace
    if not path:
        return
    line = {"pid": os.getpid(), "location": location, "pipelines": sorted(pipelines) if pipelines is not None else None,
            "stage_assets": sum(1 for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)
                                and any("lakehouse/pipeline" in (spec.tags or {}) for spec in a.specs)),
            "jobs": sorted(j.name for j in defs.jobs or []), "seconds": round(seconds, 3),
            "ended": round(time.time(), 3)}  # wall clock: where a build falls in a reload's timeline
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _build(platform: Platform, pipelines: Iterable[str] | None, location: str | None = None) -> dg.Definitions:
    wanted = set(pipelines) if pipelines is not None else None
    structure = read_structure(platform.store, wanted, location=location if wanted is None else None)
    if structure.missing_tables and not structure.catalog.stages:
        log.warning("the control DB has no metadata yet (%s): the code location is empty. Apply some with "
                    "`lakehouse metadata apply <dir>` (scripts/up.sh applies metadata/demo)",
                    ", ".join(structure.missing_tables))
    g = Graph(structure)
    # One process per run, so one JVM per run: every asset of the run shares the SparkSession.
    common = {"resources": _resources(), "executor": dg.in_process_executor}
    served = structure.location_pipelines  # one code location of several: its pipelines (None: all of them)
    built = build_stage_assets(g, wanted if wanted is not None else served)
    mine = [a for assets in built.values() for a in assets]
    if wanted is not None:
        # other pipelines' tables these stages read: loaded through the IO manager, not built
        return dg.Definitions(assets=[*mine, *upstream_specs(g, mine)], **common)
    catalog = structure.catalog
    own_stages = catalog.stages if served is None else [s for s in catalog.stages if s.pipeline_id in served]
    sources = build_source_specs(g, own_stages)
    if served is not None and (location or DEFAULT_CODE_LOCATION) != DEFAULT_CODE_LOCATION:
        # a location of its own: its pipelines, their sources and arrivals; the tables they read from other
        # locations are external specs here (materialized in their own location, shown as one asset in the UI)
        return dg.Definitions(assets=[*sources, *mine, *upstream_specs(g, mine)],
                              sensors=build_sensors(g, served, platform_loops=False),
                              schedules=build_schedules(catalog, served), **common)
    dashboard = dashboard_definitions()
    raw = entity_raw_definitions(catalog)
    maint = maintenance_definitions(catalog)
    shared = [*dashboard["assets"], *raw["assets"], *maint["assets"]]
    elsewhere = []
    if served is not None:  # the default location of several: what its stages read from the others
        here = {k for a in [*sources, *mine, *shared] for k in getattr(a, "keys", None) or [a.key]}
        elsewhere = [spec for spec in upstream_specs(g, mine) if spec.key not in here]
    return dg.Definitions(
        assets=[*sources, *mine, *elsewhere, *shared],
        jobs=[*dashboard["jobs"], *raw["jobs"], *maint["jobs"]],
        sensors=[*build_sensors(g, served), *dashboard["sensors"], *raw["sensors"], build_run_summary_sensor()],
        schedules=[*build_schedules(catalog, served), *raw["schedules"], *maint["schedules"]],
        **common,
    )


def pipeline_job(defs: dg.Definitions, pipeline_id: str) -> dg.JobDefinition:
    """A run of one pipeline: the asset job with the pipeline's stage assets selected (its
    `lakehouse/pipeline` tag, which also selects it in the UI: `tag:lakehouse/pipeline=<id>`)."""
    keys = dg.AssetSelection.tag(PIPELINE_TAG, pipeline_id).resolve(defs.resolve_asset_graph())
    if not keys:
        raise KeyError(f"pipeline {pipeline_id!r} has no stage asset in these definitions")
    return defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=keys)


class LakehouseRepositoryData(dg.RepositoryData):
    """The repository behind `defs`: the whole graph of the code location, built on first need, once
    per process, by `build_definitions()`; every question is answered by that build's repository, so
    the code server, the UI, a run worker and the `dagster` CLI see exactly what `build_definitions()`
    returns. Importing the module builds nothing."""

    def __init__(self, platform: Platform | None = None, location: str | None = None):
        self._platform = platform
        self._location = location
        self._lock = threading.RLock()
        self._full: dg.RepositoryDefinition | None = None
        self._snapshot_ids_ready = False

    def _repo(self) -> dg.RepositoryDefinition:
        with self._lock:
            if self._full is None:
                platform = self._platform or LakehouseResource.from_settings().platform()
                with _no_cyclic_gc():
                    full = build_definitions(platform, location=self._location).get_repository_def()
                    full.load_all_definitions()  # jobs resolved, sensors and schedules checked: here, once
                self._full = full
                # long-lived from here on: later collections (the code server's snapshots, sensor ticks)
                # need not traverse them again
                gc.freeze()
            return self._full

    def get_top_level_resources(self):
        return self._repo().get_top_level_resources()

    def get_env_vars_by_top_level_resource(self):
        return self._repo().get_env_vars_by_top_level_resource()

    def get_all_jobs(self):
        jobs = self._repo().get_all_jobs()
        self._snapshot_ids(jobs)
        return jobs

    def _snapshot_ids(self, jobs) -> None:
        """Every job's snapshot id, computed once and under a lock, by whoever lists all jobs first.

        Listing all jobs is what a code server's snapshot of the repository does, and after a reload
        the webserver (twice: its reload and its watcher) and the daemon ask for that snapshot at the
        same moment. Each snapshot needs every job's snapshot id (a hash of the serialized job:
        seconds for the implicit asset job, which holds every asset); Dagster caches them per job but
        not against concurrent callers. Here the first computes them and the others wait, then reuse."""
        if self._snapshot_ids_ready:
            return
        with self._lock:
            if self._snapshot_ids_ready:
                return
            with _no_cyclic_gc():
                for job in jobs:
                    job.get_job_snapshot_id()  # cached on the job definition from here on
            gc.freeze()
            self._snapshot_ids_ready = True

    def get_job_names(self):
        return self._repo().job_names

    def has_job(self, job_name: str) -> bool:
        return self._repo().has_job(job_name)

    def get_job(self, job_name: str) -> dg.JobDefinition:
        return self._repo().get_job(job_name)

    def get_all_schedules(self):
        return self._repo().schedule_defs

    def get_schedule(self, schedule_name: str):
        return self._repo().get_schedule_def(schedule_name)

    def has_schedule(self, schedule_name: str) -> bool:
        return self._repo().has_schedule_def(schedule_name)

    def get_all_sensors(self):
        return self._repo().sensor_defs

    def get_sensor(self, sensor_name: str):
        return self._repo().get_sensor_def(sensor_name)

    def has_sensor(self, sensor_name: str) -> bool:
        return self._repo().has_sensor_def(sensor_name)

    def get_source_assets_by_key(self):
        return self._repo().source_assets_by_key

    def get_assets_defs_by_key(self):
        return self._repo().assets_defs_by_key

    def get_asset_checks_defs_by_key(self):
        return self._repo().asset_checks_defs_by_key

    def get_component_tree(self):
        return self._repo().get_component_tree()


def lakehouse_repository(platform: Platform | None = None, location: str | None = None) -> dg.RepositoryDefinition:
    """The repository of one code location (None: the default one, `defs`); built on first need."""
    data = LakehouseRepositoryData(platform, location)
    return dg.repository(name=REPOSITORY_NAME)(lambda: data)


defs = lakehouse_repository(location=DEFAULT_CODE_LOCATION)
_by_location: dict[str, dg.RepositoryDefinition] = {}


def __getattr__(name: str) -> dg.RepositoryDefinition:
    """`location__<name>`: the repository of code location <name>, what a workspace entry written by
    `lakehouse workspace` loads (Dagster's loader does `getattr(module, attribute)`; a run worker of
    that location loads it the same way). Built lazily, once per process and location."""
    prefix = "location__"
    if not name.startswith(prefix):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    location = name[len(prefix):]
    check_ident(location, "code location")  # a name the workspace can hold; raises ValueError naming it
    if location == DEFAULT_CODE_LOCATION:
        return defs
    repo = _by_location.get(location)
    if repo is None:
        repo = _by_location[location] = lakehouse_repository(location=location)
    return repo


__all__ = ["build_definitions", "defs", "lakehouse_repository", "pipeline_job"]
