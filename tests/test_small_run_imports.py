"""A small `lakehouse run` written by the Arrow engine imports only what it uses (issue 21: most of
such a run's CPU is imports). In a fresh process, as a user's command runs: the run succeeds with
every guarantee it has (audit log, the run summary, DataHub proposals written before it ends), and
neither networkx nor acryl-datahub (its emission runs in a child, lakehouse.lineage.background; its
ingestion framework and telemetry are not needed at all) are imported, nor is dagster-pyspark (the
code location's Spark resource imports it when a step first asks for a session). pyspark itself
still is, without a JVM: the files path of both engines (probe, `lakehouse.ingest.reconcile`)
uses its type classes as its schema model. A code server's import of the definitions imports
neither. A Spark run's driver reads table metadata without PyIceberg's pyarrow FileIO, so without
pyarrow.dataset and pandas (lakehouse.table.fileio). Each run's process starts as the console
script's does (lakehouse._entry): the cyclic collector paused until the job starts (lakehouse.runtime.startup)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOT_IMPORTED = ("networkx", "datahub.ingestion.graph.client", "mixpanel", "httpx", "dagster_pyspark")

META = """
pipelines: [{pipeline_id: small}]
sources:
  - {source_id: events_raw, kind: files, format: jsonl, path: events, glob: "*.jsonl"}
targets:
  - {target_id: bronze_events, namespace: bronze, table: events, engine: arrow}
stages:
  - {pipeline_id: small, stage_order: 1, stage_name: ingest, layer: bronze, source_id: events_raw,
     target_id: bronze_events, validation_set_id: rules}
validation_rules:
  - rule_set_id: rules
    rules:
      - {name: id_present, type: not_null, columns: [id], action: quarantine, severity: warn}
      - {name: id_unique, type: unique, columns: [id]}
"""

SCRIPT = textwrap.dedent("""
    import atexit, gc, json, sys
    from lakehouse import _entry  # noqa: F401 - nothing else of lakehouse yet: the start-up is measured
    from lakehouse.runtime import startup

    collections = {"start-up": 0, "job": 0}  # cyclic collections before the run froze its start-up, and after

    def count(phase, info):
        if phase == "stop":
            collections["job" if gc.get_freeze_count() else "start-up"] += 1

    gc.callbacks.append(count)

    def report():
        from lakehouse.runtime import pyarrow_probes

        print(f"FROZEN {gc.get_freeze_count()}")
        print(f"COLLECTIONS {json.dumps([collections, gc.isenabled()])}")
        print(f"PROBES {json.dumps(pyarrow_probes.applied())}")
        print("MODULES " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                                             ("networkx", "datahub", "mixpanel", "httpx", "dagster_pyspark",
                                              "pyspark", "pandas", "pyarrow", "pyiceberg"))))

    atexit.register(report)
    _entry.main()  # as the console script: the command owns the process and ends it (after `report`)
""")


def _run_small(tmp_path, meta: str):
    """`lakehouse metadata apply` + `lakehouse run small` in fresh processes: (the run, its modules)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "meta.yaml").write_text(meta)
    landing = home / "landing" / "events"
    landing.mkdir(parents=True)
    (landing / "a.jsonl").write_text("".join(json.dumps({"id": i if i != 3 else None, "v": i}) + "\n"
                                             for i in range(1, 6)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env["LAKEHOUSE_HOME"] = str(home)

    def lakehouse(*args):
        return subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)

    applied = lakehouse("metadata", "apply", str(home / "meta.yaml"))
    assert applied.returncode == 0, applied.stderr
    run = lakehouse("run", "small")
    assert run.returncode == 0, (run.stdout, run.stderr)  # success with a warning (one row quarantined): exit 0
    assert "bronze/events  published" in run.stdout and "id_present warn 1 failing" in run.stdout, run.stdout
    return run, json.loads(next(line for line in run.stdout.splitlines() if line.startswith("MODULES "))[8:])


def _probes_answered(run) -> bool:
    """Whether the run answered pyarrow's pandas probes without pandas (lakehouse.runtime.pyarrow_probes)."""
    return json.loads(next(line for line in run.stdout.splitlines() if line.startswith("PROBES "))[7:])


@pytest.mark.slow  # two platform processes
def test_an_arrow_run_imports_no_networkx_nor_datahub_ingestion(tmp_path):
    home = tmp_path / "home"
    run, modules = _run_small(tmp_path, META)
    loaded = {m for m in modules if m in NOT_IMPORTED or m.split(".")[0] in NOT_IMPORTED}
    assert not loaded, f"a small Arrow run imported {sorted(loaded)}"
    # lineage is still emitted with acryl-datahub (the proposals below), by a child beside the run
    # (lakehouse.lineage.background): the run's own process does not even import it
    assert not any(m.startswith("datahub") for m in modules), modules
    # the guard above can fail: the run's files path does import pyspark's type classes
    assert "pyspark.sql.types" in modules, modules
    # nor pandas (~300 modules): the Arrow engine's conversions of Python objects would import it for
    # pyarrow's "is this a pandas object?" probes, which the run answers without it (lakehouse.runtime.pyarrow_probes)
    assert "pyarrow.compute" in modules and _probes_answered(run), modules  # the guard can fail
    assert not [m for m in modules if m.split(".")[0] == "pandas"], "a small Arrow run imported pandas"
    # what was alive when the job started (modules, definitions, instance) is frozen for the cyclic
    # collector (lakehouse_assets.cli): its full collections during the run skip it
    frozen = int(next(line for line in run.stdout.splitlines() if line.startswith("FROZEN "))[7:])
    assert frozen > 100_000, frozen
    # the collector was paused while the process started (lakehouse.runtime.startup: ~500 collections, ~0.2 s of
    # CPU before) and collected the job's garbage after the freeze, as before
    collections, enabled = json.loads(next(line for line in run.stdout.splitlines()
                                           if line.startswith("COLLECTIONS "))[12:])
    assert collections["start-up"] == 0 and collections["job"] > 0 and enabled, collections

    from lakehouse.metadata.store import MetadataStore

    store = MetadataStore(f"sqlite:///{home / 'control.db'}")
    started = store.audit_entries(event="stage_started")
    assert [e.details["engine"] for e in started] == ["arrow"]
    store.engine.dispose()
    files = list((home / "datahub" / "mcps").glob("*-small-ingest.json"))
    assert len(files) == 1
    aspects = {p["aspectName"] for p in json.loads(files[0].read_text())}
    assert {"dataProcessInstanceProperties", "dataProcessInstanceRunEvent", "assertionRunEvent"} <= aspects


def test_importing_the_definitions_imports_neither_pyspark_nor_dagster_pyspark(tmp_path):
    """A code server (and every `lakehouse run`) imports the definitions; Spark's Python side is
    imported by the first step that asks the Spark resource for a session, not before."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env["LAKEHOUSE_HOME"] = str(tmp_path)
    code = textwrap.dedent("""
        import json, sys
        import lakehouse_assets.definitions
        from resources.spark import spark_resource
        resource = spark_resource()
        before = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "dagster_pyspark", "py4j"))
        delegate = resource.pyspark_resource()
        print(json.dumps([before, type(delegate).__mro__[1].__module__, resource.spark_config == delegate.spark_config]))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before, base_module, same_conf = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == []
    # the session, when asked for, comes from dagster-pyspark's lazy resource with the same conf
    assert base_module == "dagster_pyspark.resources" and same_conf


#: the same files into a Spark bronze, and a SQL stage on Spark after it
SPARK_META = META.replace("engine: arrow}", "engine: spark}\n  - {target_id: silver_events, namespace: silver, "
                          "table: events, engine: spark}").replace(
    "validation_set_id: rules}\n", "validation_set_id: rules}\n  - {pipeline_id: small, stage_order: 2, "
    "stage_name: refine, layer: silver, target_id: silver_events,\n     transformation: "
    "\"SELECT id, v FROM bronze.events WHERE id IS NOT NULL\"}\n")


@pytest.mark.slow  # two platform processes and a JVM
def test_a_spark_run_reads_table_metadata_without_pyarrow_dataset_nor_pandas(tmp_path):
    """A Spark run's driver uses PyIceberg for metadata only (loads, snapshots, manifests, pins,
    audits): on a local warehouse through plain files (lakehouse.table.fileio), so neither PyIceberg's
    pyarrow FileIO nor pyarrow.dataset and pandas (~0.3 s of CPU) are imported; Spark writes the data."""
    run, modules = _run_small(tmp_path, SPARK_META)
    assert "silver/events  published" in run.stdout, run.stdout
    assert "pyspark.sql.session" in modules and "pyiceberg.catalog.sql" in modules, modules  # the guard can fail
    heavy = sorted(m for m in modules if m in ("pyiceberg.io.pyarrow", "pyarrow.dataset") or m.split(".")[0] == "pandas")
    assert not heavy, f"a Spark run's driver imported {heavy[:5]}"
    assert not _probes_answered(run)  # a run with a SQL stage may convert pandas with pyarrow (DuckDB's side)


#: the bronze stage's engine decided at run time: its input (~150 bytes) is over the target's threshold
AUTO_META = META.replace("engine: arrow}", "engine: auto, arrow_max_bytes: 10}")


@pytest.mark.slow  # two platform processes and a JVM
def test_an_auto_stage_too_big_for_arrow_runs_on_spark_after_the_pandas_probes_were_answered(tmp_path):
    """An `auto` stage is one the Arrow engine may write, so its run answers pyarrow's pandas probes
    without pandas before the input is known (lakehouse.runtime.pyarrow_probes); input over the threshold is
    written by Spark after all, whose driver hands pyarrow no pandas objects: the run is as before."""
    home = tmp_path / "home"
    run, modules = _run_small(tmp_path, AUTO_META)  # published, one row quarantined, the checks as with Arrow
    assert _probes_answered(run) and "pyspark.sql.session" in modules, modules

    from lakehouse.metadata.store import MetadataStore

    store = MetadataStore(f"sqlite:///{home / 'control.db'}")
    started = store.audit_entries(event="stage_started")
    store.engine.dispose()
    assert [e.details["engine"] for e in started] == ["spark"], [e.details for e in started]
    assert started[0].details["engine_reason"].startswith("auto: ") and "> 10 (target bronze_events" in \
        started[0].details["engine_reason"]
