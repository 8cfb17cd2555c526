"""control_flags for sources and targets (seed 002): a disabled source is not read (its extracts and
arrival sensors skip with the reason), a disabled target is not written (the load skips with the
reason), both in flight like the pipeline and stage flags, and `lakehouse control status` shows them."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from lakehouse.cli.demo import generate_user_events
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.stage.runner import Platform, StageRunner
from tests.fixtures.ticks import tick as evaluate_tick

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"
BRONZE = dg.AssetKey(["bronze", "user_events"])


@pytest.fixture
def demo(settings, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_DATAHUB", "off")
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.store.apply(load_metadata(DEMO))
    generate_user_events(settings.landing_dir / "user_events", rows=900, files=3, seed=21)
    return platform


def test_flags_of_unknown_datasets_are_rejected(tmp_path):
    f = tmp_path / "flags.yaml"
    f.write_text("control_flags:\n  - {entity_type: source, entity_id: nope, flag_value: false}\n"
                 "  - {entity_type: target, entity_id: gone, flag_value: false}\n")
    with pytest.raises(MetadataError) as err:
        load_metadata(f)
    text = str(err.value)
    assert "control_flags[0].entity_id: unknown source 'nope'" in text
    assert "control_flags[1].entity_id: unknown target 'gone'" in text


def test_status_reports_and_sensor_skips_for_source_and_target(demo, capsys):
    from lakehouse.cli import main as cli
    from lakehouse_assets.definitions import build_definitions
    from sensors.arrivals import SENSOR_NAME

    defs = build_definitions(demo)
    sensor = defs.get_sensor_def(SENSOR_NAME)  # one sensor over every source, a state per source
    instance = dg.DagsterInstance.ephemeral()

    def tick():
        return evaluate_tick(sensor, defs, instance=instance, cursor=None)

    def reason(result) -> str:  # the source's state as the sensor shows it on `sources/<id>`
        [event] = [e for e in result.asset_events if e.asset_key == dg.AssetKey(["sources", "user_events_raw"])]
        return f"{event.metadata['status'].value}: {event.metadata['reason'].value}"

    assert len(tick().run_requests) == 1  # three landed files, one batch

    assert cli(["source", "disable", "user_events_raw"]) == 0
    skipped = tick()
    assert not skipped.run_requests
    assert "disabled: source 'user_events_raw' is disabled by control_flags" in reason(skipped)
    assert cli(["control", "status"]) == 0
    out = capsys.readouterr().out
    status = {tuple(line.split()[:3]) for line in out.splitlines() if line.startswith(("source", "target"))}
    assert ("source", "user_events_raw", "False") in status and ("target", "bronze_user_events", "True") in status

    assert cli(["source", "enable", "user_events_raw"]) == 0
    assert cli(["target", "disable", "bronze_user_events"]) == 0
    skipped = tick()
    assert not skipped.run_requests and "target 'bronze_user_events' is disabled" in reason(skipped)
    assert cli(["control", "status"]) == 0
    out = capsys.readouterr().out
    assert ("target", "bronze_user_events", "False") in {tuple(ln.split()[:3]) for ln in out.splitlines()}
    assert cli(["target", "enable", "bronze_user_events"]) == 0
    assert len(tick().run_requests) == 1
    assert cli(["target", "disable", "no_such_target"]) == 2  # unknown ids are named, not silently stored


@pytest.mark.slow
def test_target_disabled_mid_run_means_no_commit_after_the_flip(demo, spark, monkeypatch):
    from pyiceberg.catalog.sql import SqlCatalog

    import lakehouse.validation.history as history
    from lakehouse_assets.definitions import build_definitions

    s = demo.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    seen: dict = {}
    record = history.record_outcomes

    def flip_while_auditing(runner, outcomes):
        # the operator flips the target off while the stage's checks run: after its writes to the
        # audit branch, before its publish
        record(runner, outcomes)
        table = cat.load_table("bronze.user_events")
        seen["main_before"] = table.metadata.refs["main"].snapshot_id
        seen["branch_rows"] = table.scan(snapshot_id=table.metadata.refs[f"audit_{runner.run_id.replace('-', '_')}"]
                                         .snapshot_id).to_arrow().num_rows
        demo.store.set_enabled("target", "bronze_user_events", False, by="test")

    monkeypatch.setattr(history, "record_outcomes", flip_while_auditing)
    job = build_definitions(demo).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), asset_selection=[BRONZE],
                                    raise_on_error=False)
    assert result.success  # skipped, not failed
    assert seen["branch_rows"] > 0  # the run had written its batches when the flag flipped
    table = cat.load_table("bronze.user_events")
    assert table.metadata.refs["main"].snapshot_id == seen["main_before"]  # no commit after the flip
    assert table.scan().to_arrow().num_rows == 0
    assert [r for r in table.metadata.refs if r.startswith("audit_")] == []  # its branch is gone too
    md = result.get_asset_materialization_events()[0].materialization.metadata
    assert "target 'bronze_user_events' is disabled" in md["skipped_reason"].value
    assert "before publish" in md["skipped_reason"].value
    stops = [e for e in demo.store.audit_entries(event="kill_switch") if e.run_id == result.run_id]
    assert [e.outcome for e in stops] == ["skipped"] and "before publish" in stops[0].message

    # a source switched off between extract and load: the load skips before reading anything
    monkeypatch.setattr(history, "record_outcomes", record)
    demo.store.set_enabled("target", "bronze_user_events", True, by="test")
    runner = StageRunner(demo, "user_events_etl", "bronze_ingest", run_id="srcflip1")
    plan = runner.extract()
    assert len(plan.files) == 3
    demo.store.set_enabled("source", "user_events_raw", False, by="test")
    out = StageRunner(demo, "user_events_etl", "bronze_ingest", run_id="srcflip1").load(plan)
    assert not out.published and "source 'user_events_raw' is disabled" in out.skipped_reason
    assert cat.load_table("bronze.user_events").scan().to_arrow().num_rows == 0

    # switched back on, the next run loads every landed row exactly once
    demo.store.set_enabled("source", "user_events_raw", True, by="test")
    again = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), asset_selection=[BRONZE])
    assert again.success
    landing = s.landing_dir / "user_events"
    lines = [ln for p in sorted(landing.glob("*.jsonl")) for ln in p.read_text().splitlines()]
    expected = len(lines) - sum('"event_id":null' in ln for ln in lines)  # no-id rows are quarantined
    assert cat.load_table("bronze.user_events").scan().to_arrow().num_rows == expected


GOLD = dg.AssetKey(["gold", "daily_user_events"])


def test_killed_sql_stage_skips_before_loading_its_inputs(demo, monkeypatch):
    """A SQL stage whose target is switched off is skipped by its load op before its upstream
    table is read: the IO manager hands the op loaders, not DataFrames, so the skip starts no JVM
    (this fast test fails by name if anything in the run starts one)."""
    import pyarrow as pa

    from lakehouse_assets.definitions import build_definitions

    monkeypatch.setenv("LAKEHOUSE_SPARK_WARMUP", "0")
    cat = demo.pyiceberg_catalog()  # the upstream exists (the pre-run check wants it), written by PyIceberg
    cat.create_namespace_if_not_exists("silver")
    cat.create_table("silver.user_events", pa.schema([("event_ts", pa.timestamp("us", tz="UTC")),
                                                      ("user_id", pa.string())]))
    demo.store.set_enabled("target", "gold_daily_user_events", False, by="test")
    job = build_definitions(demo).resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), asset_selection=[GOLD],
                                    raise_on_error=False)
    assert result.success  # skipped, not failed
    loaded = [e for e in result.all_events if e.event_type_value == "LOADED_INPUT"]
    # silver.user_events is a real input of the load op, loaded by the IO manager (as a loader)
    assert [e.event_specific_data.input_name for e in loaded
            if e.event_specific_data.manager_key == "iceberg_io_manager"] == ["up_0"]
    # it changed nothing: no materialization, an observation saying why (issue 39, item 3)
    assert not result.get_asset_materialization_events()
    md = result.get_asset_observation_events()[0].asset_observation_data.asset_observation.metadata
    assert "target 'gold_daily_user_events' is disabled" in md["skipped_reason"].value
    stops = [e for e in demo.store.audit_entries(event="kill_switch") if e.run_id == result.run_id]
    assert [e.outcome for e in stops] == ["skipped", "skipped"]  # before extract, and again before load
