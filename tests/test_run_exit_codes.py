"""What `lakehouse run` says and how it exits (issue 39): the ecosystem's convention (dbt, SQLMesh).

Exit 0 when the run did what its metadata says, quarantined rows and failed warn-severity checks
included (printed in the summary); 3 for those warnings with `--warn-error` or the platform setting
`run.warn_error`; 1 for a failure; 4 when a kill switch stopped the run before it started (no JVM,
no stack trace, who disabled it and when). A disabled stage skips itself and what depends on it in
its pipeline while the others publish; a check that was not evaluated has no result (Dagster shows
it as skipped), and the summary and the dashboard say "not evaluated" with the reason.

The pipelines here are Arrow-engine pipelines (no JVM): the in-process tests are the fast lane's
(its guard fails any that starts one); the real `lakehouse run` processes are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from tests.fixtures.ticks import tick
from tests.test_wap_helpers import rows_of

BIN = Path(sys.executable).parent / "lakehouse"

META = """
pipelines:
  - {pipeline_id: ex, schedule: "0 * * * *"}
  - {pipeline_id: sp}
sources:
  - {source_id: ex_raw, kind: files, format: jsonl, path: ex, glob: "*.jsonl"}
targets:
  - {target_id: ex_bronze, namespace: bronze, table: ex, engine: arrow}
  - {target_id: ex_silver, namespace: silver, table: ex, engine: arrow, write_mode: overwrite}
  - {target_id: ex_gold, namespace: gold, table: ex, engine: arrow, write_mode: overwrite}
  - {target_id: sp_gold, namespace: gold, table: sp, write_mode: overwrite}
stages:
  - {pipeline_id: ex, stage_order: 1, stage_name: ingest, layer: bronze, source_id: ex_raw, target_id: ex_bronze,
     validation_set_id: bronze_rules}
  - {pipeline_id: ex, stage_order: 2, stage_name: clean, layer: silver, target_id: ex_silver, sql_engine: duckdb,
     transformation: "SELECT id, amount FROM bronze.ex WHERE id IS NOT NULL"}
  - {pipeline_id: ex, stage_order: 3, stage_name: total, layer: gold, target_id: ex_gold, sql_engine: duckdb,
     validation_set_id: gold_rules, transformation: "SELECT COUNT(*) AS n, SUM(amount) AS total FROM silver.ex"}
  - {pipeline_id: sp, stage_order: 1, stage_name: roll_up, layer: gold, target_id: sp_gold,
     transformation: "SELECT COUNT(*) AS n FROM bronze.ex"}
validation_rules:
  - rule_set_id: bronze_rules
    rules:
      - {name: id_present, type: not_null, columns: [id], severity: warn, action: quarantine}
      - {name: amount_small, type: range, column: amount, max: 100, severity: warn}
      - {name: id_unique, type: unique, columns: [id], severity: error}
  - rule_set_id: gold_rules
    rules:
      - {name: has_rows, type: row_count, min: 1}
"""


@pytest.fixture
def lake(settings, tmp_path):
    """A platform with no SparkSession behind it, the metadata above applied."""
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    f = tmp_path / "ex.yaml"
    f.write_text(META)
    platform.store.apply(load_metadata(f))
    return platform


def land(platform, name: str, rows: list[dict]) -> None:
    out = platform.settings.landing_dir / "ex"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def good(*ids: int) -> list[dict]:
    return [{"id": i, "amount": float(i)} for i in ids]


def run_in_process(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli(["run", *args])
    return code, capsys.readouterr().out


def lines_of(out: str) -> dict[str, str]:
    """{asset: its summary line} and the lines under it, by asset."""
    got: dict[str, str] = {}
    current = None
    for ln in out.splitlines():
        if ln.startswith(("bronze/", "silver/", "gold/")):
            current = ln.split()[0]
            got[current] = ln
        elif current and ln.startswith("    "):
            got[current] += "\n" + ln
    return got


def test_a_disabled_middle_stage_skips_itself_and_its_downstream_while_upstream_publishes(lake, capsys):
    """Not a failure: bronze publishes, silver (disabled) and gold (reads silver) skip with the reason;
    gold's check is not evaluated: no check result in Dagster (it shows as skipped), "not evaluated"
    with the reason in the summary and in the data-quality dashboard."""
    land(lake, "a", good(1, 2, 3))
    assert cli(["run", "ex"]) == 0  # every stage publishes once, so gold's check has a history
    assert cli(["stage", "disable", "ex", "clean"]) == 0
    land(lake, "b", good(4, 5))
    code, out = run_in_process(capsys, "ex")
    assert code == 0, out
    assert out.splitlines()[0].endswith("(ex): SUCCESS"), out
    by = lines_of(out)
    assert by["bronze/ex"].split()[1:4] == ["published", "2", "2"], out
    assert "skipped" in by["silver/ex"].split()[1] and "stage ex.clean is disabled" in by["silver/ex"], out
    assert "Re-enable with `lakehouse stage enable ex clean`" in by["silver/ex"], out
    assert "skipped" in by["gold/ex"].split()[1], out
    assert "upstream stage ex.clean is disabled by control_flags; this stage is skipped with it" in by["gold/ex"]
    assert "    checks: has_rows not evaluated" in by["gold/ex"], out
    assert "Traceback" not in out and "FAILURE" not in out
    assert len(rows_of(lake, "bronze.ex")) == 5 and len(rows_of(lake, "silver.ex")) == 3  # silver untouched

    # Dagster: the check was planned and got no result (rendered as skipped, never as a pass)
    run_id = out.split()[1]
    instance = dg.DagsterInstance.get()
    events = [r.dagster_event for r in instance.all_logs(run_id) if r.dagster_event is not None]
    planned = [e.event_specific_data.check_name for e in events if e.event_type_value == "ASSET_CHECK_EVALUATION_PLANNED"
               and e.event_specific_data.asset_key == dg.AssetKey(["gold", "ex"])]
    evaluated = [e.event_specific_data.check_name for e in events if e.event_type_value == "ASSET_CHECK_EVALUATION"
                 and e.event_specific_data.asset_key == dg.AssetKey(["gold", "ex"])]
    assert planned == ["has_rows"] and evaluated == []
    assert "STEP_FAILURE" not in {e.event_type_value for e in events}
    # gold changed nothing: no materialization (issue 39, item 3), an observation saying why instead
    assert not [e for e in events if e.event_type_value == "ASSET_MATERIALIZATION"
                and e.event_specific_data.materialization.asset_key == dg.AssetKey(["gold", "ex"])]
    obs = [e.event_specific_data.asset_observation for e in events if e.event_type_value == "ASSET_OBSERVATION"
           and e.event_specific_data.asset_observation.asset_key == dg.AssetKey(["gold", "ex"])]
    assert "upstream stage ex.clean is disabled" in obs[0].metadata["checks_not_evaluated"].value["has_rows"]
    assert obs[0].description.startswith("nothing new since snapshot ")

    # the dashboard: the same status, with the reason; the pass rate counts evaluations only
    from lakehouse.ops.dashboard import compute_overview, render_markdown, summary

    ov = compute_overview(lake)
    rule = ov.rule("gold.ex", "has_rows")
    assert rule.status == "not evaluated" and "upstream stage ex.clean is disabled" in rule.not_evaluated
    assert rule.evaluations == 1 and rule.pass_rate == 1.0
    assert "⏸ not evaluated" in render_markdown(ov) and summary(ov)["not_evaluated_rules"] == 1

    # re-enabled: everything runs and the check is evaluated again
    assert cli(["stage", "enable", "ex", "clean"]) == 0
    land(lake, "c", good(6))
    code, out = run_in_process(capsys, "ex")
    assert code == 0 and "    checks: has_rows ok" in lines_of(out)["gold/ex"], out
    assert compute_overview(lake).rule("gold.ex", "has_rows").status == "pass"


def test_a_disabled_pipeline_launched_anyway_skips_every_step_without_failing(lake):
    """A UI launch (the asset job with the pipeline's stages selected) of a disabled pipeline: every step
    skips with the reason naming `lakehouse pipeline enable`, no step fails, no stack trace. (And the
    assets' kind badges name the engines that write them.)"""
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    land(lake, "a", good(1))
    assert cli(["pipeline", "disable", "ex"]) == 0
    # asset kinds name the engines that write each asset (not `spark` for all)
    kinds = {k.to_user_string(): sorted(t[len("dagster/kind/"):] for t in spec.tags if t.startswith("dagster/kind/"))
             for k, spec in ((s.key, s) for s in build_definitions(lake).resolve_all_asset_specs())
             if k.path[0] in ("bronze", "silver", "gold")}
    assert kinds == {"bronze/ex": ["arrow", "iceberg"], "silver/ex": ["arrow", "duckdb", "iceberg"],
                     "gold/ex": ["arrow", "duckdb", "iceberg"], "gold/sp": ["iceberg", "spark"]}, kinds
    job = pipeline_job(build_definitions(lake, pipelines=["ex"]), "ex")
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False,
                                    asset_selection=sorted(job.asset_layer.selected_asset_keys))
    assert result.success
    # a step that changed nothing and that no later step of the run waits for (gold) records an
    # observation, not a materialization; bronze and silver yield theirs so that Dagster runs their readers
    mats = {e.event_specific_data.materialization.asset_key.to_user_string():
            e.event_specific_data.materialization.metadata for e in result.all_events
            if e.event_type_value == "ASSET_MATERIALIZATION"}
    assert set(mats) == {"bronze/ex", "silver/ex"}
    mats.update({e.event_specific_data.asset_observation.asset_key.to_user_string():
                 e.event_specific_data.asset_observation.metadata for e in result.all_events
                 if e.event_type_value == "ASSET_OBSERVATION"})
    assert set(mats) == {"bronze/ex", "silver/ex", "gold/ex"}
    for md in mats.values():
        reason = md["skipped_reason"].value
        assert "pipeline 'ex' is disabled" in reason and "`lakehouse pipeline enable ex`" in reason, reason
        assert "stage enable" not in reason
    assert not [e for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def test_a_disabled_pipelines_schedule_and_sensor_ticks_skip_saying_who_and_start_no_run(lake):
    """On a persistent instance: the schedule's and the arrival sensor's ticks skip with the reason
    (who disabled the pipeline, and when) and request no run."""
    from lakehouse_assets.definitions import build_definitions

    land(lake, "a", good(1))
    assert cli(["pipeline", "disable", "ex"]) == 0
    instance = dg.DagsterInstance.get()
    runs_before = len(instance.get_run_records())
    defs = build_definitions(lake)
    schedule = defs.get_schedule_def("ex__schedule")
    sched = tick(schedule, defs, instance=instance)
    assert not sched.run_requests
    assert sched.skip_message.startswith("pipeline ex disabled by cli at "), sched.skip_message
    assert "Re-enable with `lakehouse pipeline enable ex`" in sched.skip_message
    sensor = next(s for s in defs.sensors if s.name.startswith("lakehouse_arrivals"))
    ticked = tick(sensor, defs, instance=instance)
    assert not ticked.run_requests
    assert "disabled: ex.ingest: pipeline ex disabled by cli at " in ticked.skip_message, ticked.skip_message
    assert len(instance.get_run_records()) == runs_before


def test_branches_drop_of_a_missing_branch_fails_naming_the_branches(lake, capsys):
    land(lake, "a", good(1))
    assert cli(["run", "ex", "--ephemeral"]) == 0
    capsys.readouterr()
    assert cli(["branches", "drop", "bronze.ex", "audit_doesnotexist"]) == 1
    out, err = capsys.readouterr()
    assert "dropped" not in out
    assert "bronze.ex has no branch 'audit_doesnotexist'" in err and "its branches: " in err, err
    assert cli(["branches", "drop", "bronze.nothere", "audit_x"]) == 1
    assert "no table 'bronze.nothere'" in capsys.readouterr().err


def test_a_transformation_module_is_found_next_to_the_metadata_and_a_missing_one_has_a_fix_hint(settings, tmp_path,
                                                                                               capsys, monkeypatch):
    meta = tmp_path / "meta"
    meta.mkdir()
    (meta / "ex.yaml").write_text(textwrap.dedent("""
        pipelines:
          - {pipeline_id: py}
        targets:
          - {target_id: py_bronze, namespace: bronze, table: py_src}
          - {target_id: py_gold, namespace: gold, table: py}
        sources:
          - {source_id: py_raw, kind: files, format: jsonl, path: py}
        stages:
          - {pipeline_id: py, stage_order: 1, stage_name: ingest, layer: bronze, source_id: py_raw,
             target_id: py_bronze}
          - {pipeline_id: py, stage_order: 2, stage_name: shape, layer: gold, target_id: py_gold,
             transformation: {python: "h5_meter_transforms:shape", inputs: [bronze.py_src]}}
        """))
    capsys.readouterr()
    assert cli(["metadata", "validate", str(meta)]) == 2
    err = capsys.readouterr().err
    assert "module 'h5_meter_transforms' does not import: ModuleNotFoundError" in err, err
    assert "looked in the metadata director(ies) " in err and str(meta.resolve()) in err, err
    assert "Fix: put h5_meter_transforms.py (or a package h5_meter_transforms/) in the metadata directory" in err
    (meta / "h5_meter_transforms.py").write_text("def shape(inputs):\n    return next(iter(inputs.values()))\n")
    assert cli(["metadata", "validate", str(meta)]) == 0, capsys.readouterr().err
    # applied from a directory that is not LAKEHOUSE_METADATA_DIR: apply says where runs will look
    assert cli(["metadata", "apply", str(meta)]) == 0
    out = capsys.readouterr().out
    assert (f"note: stage py.shape's module 'h5_meter_transforms' is in {meta.resolve()}, but runs import "
            "transformation modules from the metadata directory") in out, out
    # a process that runs stages imports it from the metadata directory (LAKEHOUSE_METADATA_DIR)
    env = {**os.environ, "LAKEHOUSE_METADATA_DIR": str(meta)}
    code = ("from lakehouse.platform import Platform; Platform.from_env(); "
            "from lakehouse.sources.python import resolve; print(resolve('h5_meter_transforms:shape').__module__)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.stdout.strip() == "h5_meter_transforms", proc.stderr[-2000:]


# ---------------------------------------------------------------- real `lakehouse run` processes
def trapped_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a `lakehouse` process whose JVM launcher is booby-trapped: PySpark starts
    `$SPARK_HOME/bin/spark-submit`, which here only leaves a mark and exits."""
    home = tmp_path / "spark_trap"
    (home / "bin").mkdir(parents=True)
    mark = tmp_path / "jvm_launched"
    submit = home / "bin" / "spark-submit"
    submit.write_text(f"#!/bin/sh\necho launched >> {mark}\nexit 1\n")
    submit.chmod(0o755)
    return {**os.environ, "SPARK_HOME": str(home)}, mark


def lakehouse(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # seven `lakehouse` processes (Dagster's imports each); none starts a JVM
def test_exit_codes_of_real_lakehouse_run_processes(lake, tmp_path):
    env, mark = trapped_env(tmp_path)

    def run(*args: str) -> tuple[int, str, str]:
        t0 = time.monotonic()
        p = lakehouse(env, "run", *args)
        print(f"lakehouse run {' '.join(args)}: exit {p.returncode} in {time.monotonic() - t0:.1f} s")
        return p.returncode, p.stdout, p.stderr

    land(lake, "1", good(1, 2))
    code, out, err = run("ex")
    assert code == 0 and out.splitlines()[0].endswith("(ex): SUCCESS"), out + err[-3000:]

    land(lake, "2", [*good(3), {"id": None, "amount": 1.0}])  # a quarantined row: as designed, exit 0
    code, out, err = run("ex")
    assert code == 0 and out.splitlines()[0].endswith("(ex): SUCCESS with warnings"), out + err[-3000:]
    bronze = lines_of(out)["bronze/ex"].split()  # status, read, inserted, updated, deleted, quarantined, ...
    assert bronze[1:4] == ["published", "2", "1"] and bronze[6] == "1", out

    land(lake, "3", good(4, 500))  # a warn-severity check fails: exit 0, printed in the summary
    code, out, err = run("ex")
    assert code == 0 and "amount_small warn 1 failing" in out, out + err[-3000:]
    land(lake, "4", good(5, 600))  # ... and with --warn-error, exit 3
    code, out, err = run("ex", "--warn-error")
    assert code == 3 and "SUCCESS with warnings (warnings are errors: --warn-error)" in out, out + err[-3000:]
    f = tmp_path / "setting.yaml"  # ... or with the platform setting
    f.write_text('platform_settings:\n  - {setting_key: run.warn_error, setting_value: "true"}\n')
    assert cli(["metadata", "apply", str(f)]) == 0
    land(lake, "5", good(6, 700))
    code, out, err = run("ex")
    assert code == 3, out + err[-3000:]
    f.write_text('platform_settings:\n  - {setting_key: run.warn_error, setting_value: "false"}\n')
    assert cli(["metadata", "apply", str(f)]) == 0

    land(lake, "6", good(7, 7))  # a blocking (error) check fails: exit 1
    code, out, err = run("ex")
    assert code == 1 and "FAILURE" in out.splitlines()[0] and "id_unique FAILED" in out, out + err[-3000:]
    (lake.settings.landing_dir / "ex" / "6.jsonl").unlink()
    assert not mark.exists()  # no run so far started a JVM (all Arrow and DuckDB)

    # a disabled pipeline whose run would start a JVM (a Spark SQL stage): stopped before it, exit 4
    assert cli(["pipeline", "disable", "sp"]) == 0
    code, out, err = run("sp")
    assert code == 4, out + err[-3000:]
    assert out.startswith("stopped: pipeline sp disabled by cli at "), out
    assert "`lakehouse pipeline enable sp`" in err and "stage enable" not in err and "Traceback" not in out + err
    assert not mark.exists(), "a disabled pipeline's run launched a JVM"
    (entry,) = lake.store.audit_entries(pipeline_id="sp", event="kill_switch")
    assert entry.outcome == "stopped"
    # the trap works: the same pipeline enabled launches the JVM at once (the run is then stopped here)
    assert cli(["pipeline", "enable", "sp"]) == 0
    proc = subprocess.Popen([str(BIN), "run", "sp"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists()
    finally:
        proc.kill()
        proc.wait()
