"""`lakehouse run` end to end on real Spark and Iceberg: the summary it ends with (a warn failure,
a quarantine and a skipped stage: exit 0), the same summary as the run's Dagster tags and in the audit
log; and a configuration mistake made behind validation's back (plain SQL on the control DB)
stopped by the pre-run check before the first write, without a retry."""

from __future__ import annotations

import json

import dagster as dg
import pytest
import yaml

from lakehouse.cli import main as cli
from lakehouse.metadata.model import Rule, ValidationRuleSet
from tests.fixtures.ticks import tick as evaluate_tick

pytestmark = pytest.mark.slow

COLUMNS = [{"name": "id", "type": "bigint"}, {"name": "v", "type": "string"}, {"name": "amount", "type": "double"}]


def metadata(ns: str) -> dict:
    return {
        "pipelines": [{"pipeline_id": f"{ns}_p", "default_retry_id": "three"}],
        "retry_policies": [{"retry_id": "three", "max_retries": 3, "delay_seconds": 0.1}],
        "sources": [{"source_id": f"{ns}_raw", "kind": "files", "format": "jsonl", "path": f"{ns}/raw",
                     "columns": COLUMNS},
                    {"source_id": f"{ns}_quiet", "kind": "files", "format": "jsonl", "path": f"{ns}/quiet",
                     "columns": COLUMNS}],
        "targets": [{"target_id": f"{ns}_b", "namespace": f"{ns}_bronze", "table": "events"},
                    {"target_id": f"{ns}_q", "namespace": f"{ns}_bronze", "table": "quiet"},
                    {"target_id": f"{ns}_s", "namespace": f"{ns}_silver", "table": "events",
                     "write_mode": "overwrite"}],
        "stages": [
            {"pipeline_id": f"{ns}_p", "stage_order": 1, "stage_name": "ingest", "layer": "bronze",
             "source_id": f"{ns}_raw", "target_id": f"{ns}_b", "validation_set_id": "bronze_rules"},
            {"pipeline_id": f"{ns}_p", "stage_order": 2, "stage_name": "quiet", "layer": "bronze",
             "source_id": f"{ns}_quiet", "target_id": f"{ns}_q"},
            {"pipeline_id": f"{ns}_p", "stage_order": 3, "stage_name": "clean", "layer": "silver",
             "target_id": f"{ns}_s", "validation_set_id": "silver_rules",
             "transformation": f"SELECT id, upper(v) AS v, amount FROM {ns}_bronze.events"}],
        "validation_rules": [
            {"rule_set_id": "bronze_rules", "rules": [
                {"name": "id_present", "type": "not_null", "columns": ["id"], "severity": "warn",
                 "action": "quarantine"},
                {"name": "amount_small", "type": "range", "column": "amount", "max": 100, "severity": "warn"}]},
            {"rule_set_id": "silver_rules", "rules": [
                {"name": "id_unique", "type": "unique", "columns": ["id"], "severity": "error"}]}],
    }


def land(settings, ns: str, rows: list[dict], name: str = "f1.jsonl") -> None:
    d = settings.landing_dir / ns / "raw"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_run_summary_with_warn_failure_quarantine_and_skip(platform, settings, unique_ns, tmp_path, capsys):
    ns = unique_ns
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(metadata(ns)))
    assert cli(["metadata", "apply", str(f)]) == 0
    land(settings, ns, [{"id": 1, "v": "a", "amount": 5.0}, {"id": 2, "v": "b", "amount": 500.0},
                        {"id": None, "v": "c", "amount": 1.0}, {"id": 4, "v": "d", "amount": 2.0}])
    capsys.readouterr()

    assert cli(["run", f"{ns}_p"]) == 0  # success with warnings: exit 0, as dbt and SQLMesh (issue 39)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].endswith(f"({ns}_p): SUCCESS with warnings"), out
    row = {ln.split()[0]: ln.split() for ln in lines if ln.startswith(("bronze/", "silver/"))}
    # status, read, inserted, updated, deleted, quarantined, files quarantined
    assert row["bronze/events"][1:8] == ["published", "4", "3", "0", "0", "1", "0"]  # read 4 = 3 inserted + 1 quarantined
    assert row["bronze/quiet"][1:8] == ["skipped", "0", "0", "0", "0", "0", "0"]
    assert row["silver/events"][1:8] == ["published", "3", "3", "0", "0", "0", "0"]
    assert "    checks: id_present warn 1 failing; amount_small warn 1 failing" in lines
    assert any(ln.startswith("    skipped: no new files in ") and ln.endswith(f"{ns}/quiet") for ln in lines), out
    assert "    checks: id_unique ok" in lines
    assert "DEBUG" not in out and "STEP_START" not in out  # quiet by default

    # the same summary is the run's Dagster metadata (tags) and an audit_log row
    instance = dg.DagsterInstance.get()
    run_id = lines[0].split()[1]
    tags = instance.get_run_by_id(run_id).tags
    assert tags["lakehouse/outcome"] == "success_with_warnings"
    stages = {s["asset"]: s for s in json.loads(tags["lakehouse/summary"])}
    assert stages["bronze/events"]["checks"] == {"id_present": "warn:1", "amount_small": "warn:1"}
    assert stages["bronze/events"]["quarantined"] == 1 and stages["bronze/quiet"]["status"] == "skipped"
    (entry,) = platform.store.audit_entries(run_id=run_id, event="run_summary")
    assert entry.outcome == "success_with_warnings" and entry.details["stages"][2]["rows_written"] == 3

    # -v keeps Dagster's event stream
    land(settings, ns, [{"id": 9, "v": "z", "amount": 1.0}], "f2.jsonl")
    assert cli(["run", f"{ns}_p", "-v"]) == 0  # nothing failing this time
    out, err = capsys.readouterr()
    assert "STEP_START" in out + err
    assert any(ln.startswith("run ") and ln.endswith(f"({ns}_p): SUCCESS") for ln in out.splitlines()), out

    # a run launched elsewhere (UI, schedule, sensor) gets the same tags from the summary sensor
    from lakehouse_assets.definitions import build_definitions, pipeline_job
    from lakehouse_assets.run_summary import build_run_summary_sensor

    land(settings, ns, [{"id": 10, "v": "y", "amount": 250.0}], "f3.jsonl")
    job = pipeline_job(build_definitions(platform), f"{ns}_p")
    ui_run = job.execute_in_process(instance=instance, raise_on_error=False,  # a UI run records its selection
                                    asset_selection=sorted(job.asset_layer.selected_asset_keys)).run_id
    assert "lakehouse/outcome" not in instance.get_run_by_id(ui_run).tags
    tick = evaluate_tick(build_run_summary_sensor(), instance=instance)
    assert f"{ui_run[:8]} success_with_warnings" in tick.skip_message
    ui = {s["asset"]: s for s in json.loads(instance.get_run_by_id(ui_run).tags["lakehouse/summary"])}
    assert ui["bronze/events"]["checks"]["amount_small"] == "warn:1" and ui["bronze/events"]["written"] == 1


def test_a_configuration_mistake_stops_the_run_before_its_first_write(platform, settings, unique_ns, tmp_path,
                                                                       capsys):
    ns = unique_ns
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(metadata(ns)))
    assert cli(["metadata", "apply", str(f)]) == 0
    land(settings, ns, [{"id": 1, "v": "a", "amount": 5.0}])
    # an operator edits the silver rules in the control DB directly: no validation sees it
    platform.store.upsert([ValidationRuleSet(rule_set_id="silver_rules", rules=[
        Rule(name="id_unique", type="unique", columns=["identifier"], severity="error")])])
    capsys.readouterr()

    assert cli(["run", f"{ns}_p"]) == 1
    out = capsys.readouterr().out
    assert "FAILURE" in out.splitlines()[0]
    assert ("configuration: stopped before the run's first write: 1 configuration problem(s)" in out
            and "rule 'id_unique' (stage" in out and "checks column(s) ['identifier']" in out), out
    run_id = out.split()[1]
    # nothing was written: not bronze (upstream of the broken stage), not silver
    tables = platform.tables()
    assert not tables.exists(f"{ns}_bronze.events") and not tables.exists(f"{ns}_silver.events")
    # terminal: no retry was requested although the pipeline has a retry policy of 3
    instance = dg.DagsterInstance.get()
    kinds = {e.event_type_value for e in
             (r.dagster_event for r in instance.all_logs(run_id)) if e is not None}
    assert "STEP_UP_FOR_RETRY" not in kinds and "STEP_FAILURE" in kinds
    assert platform.store.audit_entries(run_id=run_id, event="retry") == []
    (pre,) = platform.store.audit_entries(run_id=run_id, event="preflight")
    assert pre.outcome == "failed" and "identifier" in pre.message


def test_sql_that_spark_alone_can_refuse_fails_once_as_configuration(platform, settings, unique_ns, tmp_path,
                                                                      capsys):
    """sqlglot cannot type LATERAL VIEW for Spark, so the static checks leave this SQL to Spark; its
    AnalysisException is a ConfigurationError: the stage fails once, not after three retries."""
    ns = unique_ns
    md = metadata(ns)
    md["stages"][2]["transformation"] = (f"SELECT e, no_such_column FROM {ns}_bronze.events "
                                         "LATERAL VIEW explode(array(id)) x AS e")
    md["stages"][2].pop("validation_set_id")
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(md))
    assert cli(["metadata", "apply", str(f)]) == 0
    land(settings, ns, [{"id": 1, "v": "a", "amount": 5.0}])
    capsys.readouterr()
    assert cli(["run", f"{ns}_p"]) == 1
    out = capsys.readouterr().out
    silver = next(ln for ln in out.splitlines() if ln.startswith("    failed:"))
    assert "ConfigurationError" in silver and "its SQL does not fit the tables it reads" in silver, out
    run_id = out.split()[1]
    kinds = [r.dagster_event.event_type_value for r in dg.DagsterInstance.get().all_logs(run_id)
             if r.dagster_event is not None]
    assert "STEP_UP_FOR_RETRY" not in kinds and kinds.count("STEP_FAILURE") == 1
