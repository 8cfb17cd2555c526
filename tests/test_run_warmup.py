"""A run launched by the UI, a sensor or a schedule starts its JVM before its first step when a
selected stage may need Spark (the PySpark resource's set-up, `LakehouseResource.warm_up_for_run`), as `lakehouse run` does
before its imports: decided from the control DB by `lakehouse.engines.choice.stages_may_need_spark` for the
run's asset selection. No JVM here: `Platform.warm_spark` is replaced by a recorder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import dagster as dg
import pytest

from lakehouse.engines.choice import stages_may_need_spark
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.runtime import spark as sparkmod
from lakehouse.settings import load_settings
from resources.lakehouse import LakehouseResource
from resources.spark import spark_resource
from tests.test_arrow_engine import META, RULES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def started(tmp_path, monkeypatch) -> list[str]:
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for name in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_SPARK_WARMUP"):
        monkeypatch.delenv(name, raising=False)
    calls: list[str] = []
    monkeypatch.setattr(Platform, "warm_spark", lambda self: calls.append(self.settings.catalog_name))
    monkeypatch.setattr(sparkmod, "started_or_starting", lambda: False)  # the test process's own session aside
    store = MetadataStore(load_settings().control_db_url)
    store.apply(load_metadata(REPO / "metadata" / "demo"))
    arrow = tmp_path / "arrow.yaml"
    arrow.write_text(META.replace("ENGINE", "auto").replace(
        "RULES", textwrap.indent(textwrap.dedent(RULES).strip(), "      ")) + "\n")
    store.apply(load_metadata(arrow))
    return calls


def _setup(*paths: list[str], run: bool = True) -> None:
    dagster_run = dg.DagsterRun(job_name="__ASSET_JOB", asset_selection=frozenset(dg.AssetKey(p) for p in paths)) \
        if run else None
    context = dg.InitResourceContext(resource_config=None, resources=None, resource_def=None, all_resource_defs={},
                                     dagster_run=dagster_run)
    pyspark = spark_resource(LakehouseResource())
    pyspark.setup_for_execution(context)
    pyspark.teardown_after_execution(context)  # the session conf it configured is this run's only


def test_a_selection_with_a_sql_stage_starts_the_jvm_before_the_first_step(started):
    _setup(["bronze", "user_events"], ["silver", "user_events"], ["gold", "daily_user_events"])  # Materialize all
    assert started == [load_settings().catalog_name]
    started.clear()
    _setup(["gold", "daily_user_events"])  # a SQL stage alone
    assert len(started) == 1


def test_arrow_stages_start_none(started):
    _setup(["bronze", "user_events"])  # the demo's bronze: engine auto, a file load the Arrow engine writes
    _setup(["bronze", "events"])  # an Arrow-only pipeline
    _setup(["entity_raw", "salesforce"], ["maintenance", "silver"])  # keys that are no stage: left to the steps
    assert started == []


def test_nothing_to_decide_from_starts_none(started, monkeypatch):
    _setup(run=False)  # a sensor's or a schedule's evaluation: no run
    _setup()  # a run without an asset selection (an op job): its steps start Spark when they need it
    monkeypatch.setenv("LAKEHOUSE_SPARK_WARMUP", "0")
    _setup(["silver", "user_events"])
    assert started == []


def test_the_decision_is_the_runs_own(started):
    """The same rule as `lakehouse run`'s (`may_need_spark` is it over a pipeline's stages)."""
    catalog = MetadataStore(load_settings().control_db_url).load()
    demo = catalog.stages_of("user_events_etl")
    assert stages_may_need_spark(catalog, demo)
    assert not stages_may_need_spark(catalog, [s for s in demo if s.layer == "bronze"])
    assert not stages_may_need_spark(catalog, catalog.stages_of("events_etl"))


def test_a_jvm_still_starting_at_the_runs_end_is_released(monkeypatch):
    """The run's resources are torn down once, after its last step: a JVM the warm-up is still
    starting then (its Spark stages were skipped) is killed; a session, or a JVM no warm-up started
    (the test session's own), is left alone."""
    released: list[bool] = []
    monkeypatch.setattr(sparkmod, "release_jvm_at_exit", lambda: released.append(True))
    run = dg.DagsterRun(job_name="__ASSET_JOB", asset_selection=frozenset({dg.AssetKey(["silver", "user_events"])}))

    def teardown(dagster_run, starting: bool) -> None:
        monkeypatch.setattr(sparkmod, "starting", lambda: starting)
        context = dg.InitResourceContext(resource_config=None, resources=None, resource_def=None,
                                         all_resource_defs={}, dagster_run=dagster_run)
        LakehouseResource().teardown_after_execution(context)

    teardown(run, starting=False)
    teardown(None, starting=True)
    assert released == []
    teardown(run, starting=True)
    assert released == [True]


def test_starting_means_a_warm_up_still_starting(monkeypatch):
    """`starting` is what the teardown asks: a warm-up thread alive and no session yet."""
    import threading

    monkeypatch.setattr(sparkmod, "_SESSION", None)
    monkeypatch.setattr(sparkmod, "_EARLY", {})
    assert not sparkmod.starting()  # no warm-up in this process
    gate = threading.Event()
    thread = threading.Thread(target=gate.wait)
    thread.start()
    monkeypatch.setitem(sparkmod._EARLY, "thread", thread)
    try:
        assert sparkmod.starting() and sparkmod.started_or_starting()
        monkeypatch.setattr(sparkmod, "_SESSION", object())  # the session came up
        assert not sparkmod.starting() and sparkmod.started_or_starting()
    finally:
        gate.set()
        thread.join()
    monkeypatch.setattr(sparkmod, "_SESSION", None)
    assert not sparkmod.starting()  # the warm-up ended without a session (it failed): nothing is starting


E2E = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import dagster as dg
    from lakehouse.runtime import procstat
    from lakehouse.cli.demo import generate_user_events
    from lakehouse.metadata.loader import load_metadata
    from lakehouse.platform import Platform
    from lakehouse.runtime.spark import _own_spark_children
    from lakehouse_assets.definitions import build_definitions

    platform = Platform.from_env()
    platform.store.apply(load_metadata(Path(sys.argv[1])))
    generate_user_events(platform.settings.landing_dir / "user_events", rows=600, files=2, seed=3)
    job = build_definitions(platform).resolve_implicit_global_asset_job_def()
    keys = [dg.AssetKey(k) for k in (["bronze", "user_events"], ["silver", "user_events"], ["gold", "daily_user_events"])]
    instance = dg.DagsterInstance.ephemeral()
    result = job.execute_in_process(instance=instance, asset_selection=keys, raise_on_error=False)
    steps = {}
    for e in instance.all_logs(result.run_id, of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS}):
        steps[f"{e.step_key} {e.dagster_event.event_type_value}"] = e.timestamp
    jvms = [procstat.read(pid).start_epoch() for pid in _own_spark_children()]
    print("RESULT " + json.dumps({"success": result.success, "steps": steps, "jvms": jvms}))
""")


@pytest.mark.slow  # two platform processes, each with its JVM
@pytest.mark.parametrize("warmup", ["1", "0"])
def test_a_launched_run_starts_its_jvm_before_its_first_step(tmp_path, warmup):
    """A run of the demo's three stages executed by Dagster in a fresh process (as a run worker
    executes a launched run: no `lakehouse run` warm-up before it): with the warm-up its one JVM is
    launched before the first step starts, so it starts while the Arrow engine loads bronze; with
    LAKEHOUSE_SPARK_WARMUP=0 silver's step launches it (the test tells the two apart)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env.update({"LAKEHOUSE_HOME": str(tmp_path / "home"), "LAKEHOUSE_SPARK_WARMUP": warmup,
                "PYTHONPATH": str(REPO)})
    proc = subprocess.run([sys.executable, "-c", E2E, str(REPO / "metadata" / "demo")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out["success"], out
    [jvm] = out["jvms"]  # one JVM for the run
    steps = out["steps"]
    first = min(t for k, t in steps.items() if k.endswith("STEP_START"))
    silver = steps["silver__user_events STEP_START"]
    bronze_done = steps["bronze__user_events.bronze__user_events__load STEP_SUCCESS"]
    if warmup == "1":
        assert jvm < first <= bronze_done < silver, (jvm, steps)
    else:
        assert jvm > silver, (jvm, steps)


TEARDOWN_E2E = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import dagster as dg
    import pyspark.java_gateway as jg
    from lakehouse.runtime import procstat
    from lakehouse.runtime import spark as sparkmod
    from lakehouse.metadata.loader import load_metadata
    from lakehouse.platform import Platform
    from lakehouse_assets.definitions import build_definitions

    import threading

    jvms, running = set(), threading.Event()
    real = jg.launch_gateway

    def slow_gateway(*args, **kwargs):  # a real JVM whose session is still being made when the run ends
        gateway = real(*args, **kwargs)
        time.sleep(float(sys.argv[2]))
        return gateway

    def watch():  # every JVM this process launches, whenever it is seen
        while not running.is_set():
            jvms.update(sparkmod._own_spark_children())
            time.sleep(0.05)

    jg.launch_gateway = slow_gateway
    import pyspark.context
    pyspark.context.launch_gateway = slow_gateway

    platform = Platform.from_env()
    platform.store.apply(load_metadata(Path(sys.argv[1])))
    job = build_definitions(platform).resolve_implicit_global_asset_job_def()
    instance = dg.DagsterInstance.ephemeral()
    # silver alone on an empty catalog: a SQL stage (the warm-up starts a JVM), stopped at once by the
    # pre-run check (its upstream table does not exist yet), so the run ends while the JVM is starting
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey(["silver", "user_events"])],
                                    raise_on_error=False)
    running.set()
    watcher.join()
    time.sleep(0.5)
    alive = [pid for pid in jvms if procstat.read(pid) is not None and procstat.read(pid).state != "Z"]
    print("RESULT " + json.dumps({"jvms": sorted(jvms), "alive": alive, "session": sparkmod._SESSION is not None,
                                  "steps": [e.event_type_value for e in result.all_events if e.is_step_event]}),
          flush=True)
""")


@pytest.mark.slow  # a platform process with a JVM
def test_a_jvm_still_starting_when_a_launched_run_ends_is_killed(tmp_path):
    """End to end in a fresh process: a run whose only stage needs Spark but stops first (its
    upstream does not exist yet) ends while its warm-up's JVM is still making the session; the run's
    resource teardown kills that JVM instead of leaving it to finish starting on the cores other
    runs use. The JVM is made to stay "starting" for a while after it is up (its gateway answer is
    held back), so the test does not depend on which finishes first."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env.update({"LAKEHOUSE_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)})
    proc = subprocess.run([sys.executable, "-c", TEARDOWN_E2E, str(REPO / "metadata" / "demo"), "20"], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert "STEP_FAILURE" in out["steps"] and not out["session"], out  # stopped before it needed Spark
    assert len(out["jvms"]) == 1 and out["alive"] == [], out  # the run's one JVM, killed by the teardown
