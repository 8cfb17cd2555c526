"""The code location: `dagster dev` loads `defs` from here (see [tool.dagster] and workspace.yaml).

Importing this module reads, writes and connects to nothing. `defs` is a repository whose members
are built from the control DB when Dagster first asks for them, in one read of the structural
metadata and of what `lakehouse metadata apply` derived from it (no SQL parsing, no writes):

* the code server (the UI, sensors, schedules) asks for everything and gets the whole graph;
* a run worker (`dagster api execute_run`, a run launched from the UI, a sensor or a schedule)
  asks only for its job and selection: a pipeline's run is Dagster's implicit asset job with the
  pipeline's stage assets selected (there is no job per pipeline), and for a selection of stage
  assets the worker builds the pipelines owning them alone, so a run pays for its own pipeline,
  not for every pipeline the platform has. Other runs (the dashboard job, a selection holding a
  source, maintenance or entity_raw asset) get the whole graph.

Setting up the embedded defaults (demo metadata, entity_raw tables) is `lakehouse metadata apply`'s
job (scripts/up.sh), not this module's.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable

import dagster as dg

from lakehouse.metadata.assets import PIPELINE_TAG, pipelines_of_paths
from lakehouse.metadata.derived import read_structure
from lakehouse.metadata.model import DEFAULT_CODE_LOCATION, check_ident
from lakehouse.runner import Platform
from lakehouse.settings import DagsterSettings, current
from lakehouse_assets import run_workers
from lakehouse_assets.dashboard import dashboard_definitions
from lakehouse_assets.entity_raw_assets import entity_raw_definitions
from lakehouse_assets.factory import PIPELINES_JOB, Graph, build_source_specs, build_stage_assets, upstream_specs
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


def _wrapped(resources: dict) -> tuple[dict, dict]:
    """(the top-level resources, what Dagster's `with_resources` binds to every asset) as
    `Definitions` wraps them (dagster._core.definitions.definitions_class and
    dagster._core.execution.with_resources): the same objects, wrapped once here so the stage assets
    can be built bound to them."""
    from dagster._core.definitions.job_definition import default_job_io_manager_with_fs_io_manager_schema
    from dagster._core.definitions.utils import DEFAULT_IO_MANAGER_KEY
    from dagster._core.execution.build_resources import wrap_resources_for_execution

    top = wrap_resources_for_execution(resources)
    return top, wrap_resources_for_execution({DEFAULT_IO_MANAGER_KEY: default_job_io_manager_with_fs_io_manager_schema,
                                              **top})


def _bind_once(asset: dg.AssetsDefinition) -> dg.AssetsDefinition:
    """A stage asset built with its resources bound (`_wrapped`) answers `Definitions`' binding of
    those same resources with itself, where Dagster copies every asset to bind them (a second
    construction plus a requirements check per asset: a fifth of the build at 1,000 pipelines,
    issue 22). Any other binding (`dg.materialize(assets, resources=...)`) gets what it got before:
    Dagster's method on the asset without resources. tests/test_derived_metadata.py checks the
    repository, its snapshots and each asset's resources against Dagster's own binding."""
    own = asset.resource_defs

    def with_resources(resource_defs):
        if resource_defs.keys() <= own.keys() and all(own[k] is v for k, v in resource_defs.items()):
            return asset
        with warnings.catch_warnings():  # Dagster's own copy passes its beta parameter too
            warnings.simplefilter("ignore")
            unbound = type(asset)(**{**asset.get_attributes_dict(), "resource_defs": {}})
        return dg.AssetsDefinition.with_resources(unbound, resource_defs)

    asset.with_resources = with_resources
    return asset


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
    resources, for_assets = _wrapped(_resources())
    # One process per run, so one JVM per run: every asset of the run shares the SparkSession.
    common = {"resources": resources, "executor": dg.in_process_executor}
    served = structure.location_pipelines  # one code location of several: its pipelines (None: all of them)
    built = build_stage_assets(g, wanted if wanted is not None else served, for_assets)
    mine = [_bind_once(a) for assets in built.values() for a in assets]
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


def _run_being_executed() -> dg.DagsterRun | None:
    """The run this thread is executing, when Dagster loads the run's job.

    A run worker loads its job twice: once by name alone, "early", to fail fast on a broken code
    location (`dagster._grpc.impl.core_execute_run`), then with the run's asset selection to execute
    it. Only the second call carries the selection, so the first would build every pipeline. Both
    run inside the frame holding the run (`dagster_run`), where its selection is read; anywhere
    else (a code server, the CLI) there is none and the whole graph answers, as before."""
    frame = sys._getframe(1)
    while frame is not None:
        run = frame.f_locals.get("dagster_run")
        if isinstance(run, dg.DagsterRun):
            return run
        frame = frame.f_back
    return None


class LakehouseRepositoryData(dg.RepositoryData):
    """The repository behind `defs`: the whole graph is built on first need, once per process,
    except that a run of the asset job selecting stage assets only (what a run worker asks for
    first: `subset_job`) builds the pipelines owning them. Every other question is answered by the
    whole graph, so the code server, the UI and the `dagster` CLI see exactly what
    `build_definitions()` returns."""

    def __init__(self, platform: Platform | None = None, location: str | None = None):
        self._platform = platform
        self._location = location
        self._lock = threading.RLock()
        self._full: dg.RepositoryDefinition | None = None
        self._subsets: dict[tuple, dg.JobDefinition] = {}
        self._snapshot_lock = threading.RLock()  # ids and repository snaps: built once, by the first asker
        self._snapshot_ids_ready = False
        self._snaps: dict[bool, object] = {}
        self._serialized: dict[tuple, str] = {}

    def _get_platform(self) -> Platform:
        return self._platform or LakehouseResource.from_settings().platform()

    def _data(self) -> dg.RepositoryData:
        with self._lock:
            if self._full is None:
                with _no_cyclic_gc():
                    self._full = build_definitions(self._get_platform(), location=self._location
                                                   ).get_repository_def()
                    self._full.load_all_definitions()  # jobs resolved, sensors and schedules checked: here, once
                # long-lived from here on: later collections (the code server's snapshots, sensor ticks)
                # need not traverse them again
                gc.freeze()
            return self._full._repository_data  # noqa: SLF001 - no public accessor; we delegate to it whole

    def subset_job(self, job_name: str, asset_selection, asset_check_selection) -> dg.JobDefinition | None:
        """The asset job's run of these stage assets, built from the pipelines owning them alone; None
        when the question is another (another job, no selection, a non-stage asset, the whole graph
        already built)."""
        if job_name != PIPELINES_JOB:
            return None
        if not asset_selection and self._full is None:
            run = _run_being_executed()  # a run worker's early load of the job it is about to subset
            if run is not None and run.asset_selection:
                asset_selection, asset_check_selection = run.asset_selection, run.asset_check_selection
        if not asset_selection:
            return None
        key = (frozenset(asset_selection), frozenset(asset_check_selection) if asset_check_selection is not None
               else None)
        with self._lock:
            if key in self._subsets:
                return self._subsets[key]
            if self._full is not None:
                return None
            platform = self._get_platform()
            owners = pipelines_of_paths(platform.store, [k.path for k in asset_selection])
            if owners is None:
                return None
            defs = build_definitions(platform, pipelines=owners)
            with _no_cyclic_gc():
                job = defs.get_repository_def().get_maybe_subset_job_def(
                    job_name, asset_selection=set(asset_selection),
                    asset_check_selection=set(asset_check_selection) if asset_check_selection is not None else None)
            log.info("built the run's job from pipeline(s) %s alone (%d asset(s))", ", ".join(sorted(owners)),
                     len(job.asset_layer.selected_asset_keys))
            self._subsets[key] = job
            return job

    def get_job(self, job_name: str) -> dg.JobDefinition:
        return self._data().get_job(job_name)

    # -- everything else: the whole graph
    def get_top_level_resources(self):
        return self._data().get_top_level_resources()

    def get_env_vars_by_top_level_resource(self):
        return self._data().get_env_vars_by_top_level_resource()

    def get_all_jobs(self):
        jobs = self._data().get_all_jobs()
        self._snapshot_ids(jobs)
        return jobs

    def _snapshot_ids(self, jobs) -> None:
        """Every job's snapshot id, computed once and under a lock, by whoever lists all jobs first.

        Listing all jobs is what a code server's snapshot of the repository does (RepositorySnap),
        and after a reload the webserver (twice: its reload and its watcher) and the daemon ask for
        that snapshot at the same moment. Each snapshot needs every job's snapshot id (a hash of
        the serialized job: seconds for the implicit asset job, which holds every asset); Dagster caches
        them per job but not against concurrent callers, so three requests computed them three times
        over, interleaved on the GIL. Here the first computes them and the others wait, then reuse.
        A run worker asks for its own job and selection and does not pay for this."""
        if self._snapshot_ids_ready:
            return
        with self._snapshot_lock:
            if self._snapshot_ids_ready:
                return
            with _no_cyclic_gc():
                for job in jobs:
                    job.get_job_snapshot_id()  # cached on the job definition from here on
            gc.freeze()
            self._snapshot_ids_ready = True

    def repository_snap(self, build, defer_snapshots: bool):
        """The repository's snapshot for the UI (`RepositorySnap`), built once per process and kind.

        After a reload three clients (the webserver's reload, its server watcher, the daemon) ask
        the new code server for the snapshot at the same moment, and Dagster's server builds it
        once per request (every asset node and check snapshot: seconds of CPU at 1,000 pipelines,
        three times over on the same GIL). The definitions cannot change within a code server's
        life (a reload is a new process), so the first request builds it under a lock and the
        others reuse it (issue 22). `_share_repository_snaps` routes `RepositorySnap.from_def` here."""
        with self._snapshot_lock:
            snap = self._snaps.get(defer_snapshots)
            if snap is None:
                with _no_cyclic_gc():
                    snap = self._snaps[defer_snapshots] = build()
                gc.freeze()
            return snap

    def serialized(self, key: tuple, build) -> str:
        """What the code server sends for `key` (the repository's snapshot, a job's snapshot), serialized
        once per process and reused for every later request.

        The three clients of a reload each receive the repository's snapshot (15 MB at 1,000
        pipelines) and the implicit asset job's (13.6 MB); serializing them is about 1.2 s of CPU per
        client, on the code server's one GIL. `_share_serialized_replies` routes the server's requests
        here; an error is never stored (the next request tries again)."""
        with self._snapshot_lock:
            text = self._serialized.get(key)
            if text is None:
                with _no_cyclic_gc():
                    text = self._serialized[key] = build()
            return text

    def get_job_names(self):
        return self._data().get_job_names()

    def has_job(self, job_name: str) -> bool:
        return self._data().has_job(job_name)

    def get_schedule_names(self):
        return self._data().get_schedule_names()

    def get_all_schedules(self):
        return self._data().get_all_schedules()

    def get_schedule(self, schedule_name: str):
        return self._data().get_schedule(schedule_name)

    def has_schedule(self, schedule_name: str) -> bool:
        return self._data().has_schedule(schedule_name)

    def get_all_sensors(self):
        return self._data().get_all_sensors()

    def get_sensor_names(self):
        return self._data().get_sensor_names()

    def get_sensor(self, sensor_name: str):
        return self._data().get_sensor(sensor_name)

    def has_sensor(self, sensor_name: str) -> bool:
        return self._data().has_sensor(sensor_name)

    def get_source_assets_by_key(self):
        return self._data().get_source_assets_by_key()

    def get_assets_defs_by_key(self):
        return self._data().get_assets_defs_by_key()

    def get_asset_checks_defs_by_key(self):
        return self._data().get_asset_checks_defs_by_key()

    def get_component_tree(self):
        return self._data().get_component_tree()

    def get_asset_job_nodes(self):
        return self._data().get_asset_job_nodes()

    def load_all_definitions(self):
        self._data().load_all_definitions()


class LakehouseRepository(dg.RepositoryDefinition):
    """Dagster asks the repository for a run's job by name and selection
    (`ReconstructableJob.get_definition`, the code server's subset snapshots): a run of stage assets
    gets them from their own pipelines (`LakehouseRepositoryData.subset_job`), so a run worker pays
    for its own pipeline, not for every pipeline of the platform (issue 22 item 3)."""

    def get_maybe_subset_job_def(self, job_name, op_selection=None, asset_selection=None,
                                 asset_check_selection=None):
        data = self._repository_data  # always ours: lakehouse_repository builds it
        job = None if op_selection else data.subset_job(job_name, asset_selection, asset_check_selection)
        return job or super().get_maybe_subset_job_def(job_name, op_selection, asset_selection,
                                                        asset_check_selection)


def _share_repository_snaps() -> None:
    """Route `RepositorySnap.from_def` of a lakehouse repository through its data's
    `repository_snap` (one snapshot per code server process); any other repository is untouched.

    Dagster's code server has no hook for this: its `_get_serialized_external_repository_data`
    calls the classmethod per request. The wrapper keeps its signature and result, and is
    installed once per process, when the code location is imported."""
    from dagster._core.remote_representation.external_data import RepositorySnap

    original = RepositorySnap.from_def.__func__
    if getattr(original, "_lakehouse_shared", False):
        return

    def from_def(cls, repository_def, defer_snapshots: bool = False):
        data = getattr(repository_def, "_repository_data", None)
        if cls is not RepositorySnap or not isinstance(data, LakehouseRepositoryData):
            return original(cls, repository_def, defer_snapshots)
        return data.repository_snap(lambda: original(cls, repository_def, defer_snapshots), defer_snapshots)

    from_def._lakehouse_shared = True
    from_def.__wrapped__ = original
    from_def.__doc__ = original.__doc__
    RepositorySnap.from_def = classmethod(from_def)


def _share_serialized_replies() -> None:
    """The code server's answers to `ExternalRepository` / `StreamingExternalRepository` (through
    `_get_serialized_external_repository_data`) and `ExternalJob` for a lakehouse repository are
    serialized once per process (`LakehouseRepositoryData.serialized`); the text is exactly what
    Dagster's own methods return (tests/test_derived_metadata.py compares them). Anything else — another
    repository, an origin that does not resolve, a failing build — goes to Dagster's method, which
    reports the error as it always does. Installed with the code location in a process that runs a
    code server (it has imported Dagster's server before loading us); a run worker or the CLI does
    not import the gRPC server for it."""
    from dagster._core.remote_origin import RemoteRepositoryOrigin
    from dagster._core.remote_representation.external_data import JobDataSnap, RepositorySnap
    from dagster._grpc.__generated__ import dagster_api_pb2
    from dagster._grpc.server import DagsterApiServer
    from dagster._serdes import deserialize_value, serialize_value

    original_repo = DagsterApiServer._get_serialized_external_repository_data
    original_job = DagsterApiServer.ExternalJob
    if getattr(original_repo, "_lakehouse_shared", False):
        return

    def ours(server, serialized_origin: str):
        """The repository definition and its data when it is a lakehouse repository, else None."""
        try:
            repo = server._get_repo_for_origin(deserialize_value(serialized_origin, RemoteRepositoryOrigin))  # noqa: SLF001
        except Exception:  # noqa: BLE001 - Dagster's own method reports it
            return None
        data = getattr(repo, "_repository_data", None)
        return (repo, data) if isinstance(data, LakehouseRepositoryData) else None

    def repository_data(self, request):
        found = ours(self, request.serialized_repository_python_origin)
        if found is None:
            return original_repo(self, request)
        repo, data = found
        try:
            return data.serialized(("repository", bool(request.defer_snapshots)), lambda: serialize_value(
                RepositorySnap.from_def(repo, defer_snapshots=request.defer_snapshots)))
        except Exception:  # noqa: BLE001 - Dagster's own method serializes the error for the client
            return original_repo(self, request)

    def external_job(self, request, context):
        found = ours(self, request.serialized_repository_origin)
        if found is None:
            return original_job(self, request, context)
        repo, data = found
        try:
            text = data.serialized(("job", request.job_name), lambda: serialize_value(
                JobDataSnap.from_job_def(repo.get_job(request.job_name), include_parent_snapshot=True)))
        except Exception:  # noqa: BLE001
            return original_job(self, request, context)
        return dagster_api_pb2.ExternalJobReply(serialized_job_data=text)

    for new, old in ((repository_data, original_repo), (external_job, original_job)):
        new._lakehouse_shared = True
        new.__wrapped__ = old
        new.__doc__ = old.__doc__
    DagsterApiServer._get_serialized_external_repository_data = repository_data
    DagsterApiServer.ExternalJob = external_job


_share_repository_snaps()
if "dagster._grpc.server" in sys.modules:
    _share_serialized_replies()
    run_workers.install()  # the code server's run workers fork from a preloaded server (issue 21)


def lakehouse_repository(platform: Platform | None = None, location: str | None = None) -> dg.RepositoryDefinition:
    """The repository of one code location (None: the default one, `defs`); built on first need."""
    return LakehouseRepository(REPOSITORY_NAME, repository_data=LakehouseRepositoryData(platform, location))


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
