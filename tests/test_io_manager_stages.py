"""Stage outputs go through the Iceberg IO manager: a SQL stage and a Python-transformation stage
publish through it with their asset checks (read back by PyIceberg, not the platform's Spark
read path), and a downstream stage's upstream tables are asset inputs loaded at the snapshot the
run pinned, even when main moved after the pin."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest

from lakehouse.stage import pins
from tests.test_wap_helpers import BASE, land, land_customers, main_snapshot, order, pyiceberg, rows_of
from tests.test_wap_helpers import apply as apply_rules

pytestmark = pytest.mark.slow

#: silver.orders (SQL, BASE) feeds gold.big_orders, computed by `big_orders` below
PYTHON_STAGE = BASE.replace("targets:\n", "targets:\n  - {target_id: gold_big, namespace: gold, table: big_orders, "
                            "write_mode: overwrite}\n") + """
  - {pipeline_id: orders_etl, stage_order: 3, stage_name: big, layer: gold, target_id: gold_big,
     validation_set_id: order_rules,
     transformation: {python: "tests.test_io_manager_stages:big_orders", inputs: [silver.orders]}}
"""

RULES = "- {name: id_present, type: not_null, columns: [order_id], severity: error}"


def big_orders(inputs):
    """The Python transformation: orders of 20 or more, from the pinned silver.orders."""
    return inputs["silver.orders"].where("amount >= 20").select("order_id", "amount")


def _job(platform):
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    return pipeline_job(build_definitions(platform), "orders_etl")


def test_sql_and_python_stages_publish_through_the_io_manager_with_checks(platform, tmp_path):
    apply_rules(platform, tmp_path, RULES, base=PYTHON_STAGE)
    land_customers(platform)
    land(platform, "orders", "b1", [order(1, amount=10.0), order(2, amount=25.0), order(3, amount=40.0)])
    res = _job(platform).execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert res.success

    # each stage's output was handled by the IO manager (the write happened there) and carries its checks
    handled = {e.step_key for e in res.all_events if e.event_type_value == "HANDLED_OUTPUT"
               and e.event_specific_data.manager_key == "iceberg_io_manager"}
    # SQL and Python stages read lake tables only: one op each (no source pool), named as the asset
    assert {"silver__orders", "gold__big_orders"} <= handled
    evals = {(c.asset_key.to_user_string(), c.check_name): c.passed for c in res.get_asset_check_evaluations()}
    assert evals[("gold/big_orders", "id_present")] is True
    mats = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    # the stage ops' Spark resource (dagster-pyspark) is the platform's one process-wide session
    from resources.spark import spark_resource

    assert spark_resource().spark_session is platform.spark()

    # an independent reader: PyIceberg's scan of main, at the snapshot the materialization names
    assert sorted(r["order_id"] for r in rows_of(platform, "silver.orders")) == [1, 2, 3]
    assert sorted(r["order_id"] for r in rows_of(platform, "gold.big_orders")) == [2, 3]
    for ident, key in (("silver.orders", "silver/orders"), ("gold.big_orders", "gold/big_orders")):
        assert mats[key]["snapshot_id"].value == str(main_snapshot(platform, ident))
        assert mats[key]["published"].value is True


def test_upstream_input_is_read_at_the_runs_pin_after_main_moved(platform, tmp_path):
    apply_rules(platform, tmp_path, RULES, base=PYTHON_STAGE)
    land_customers(platform)
    land(platform, "orders", "b1", [order(1, amount=30.0)])
    assert _job(platform).execute_in_process(instance=dg.DagsterInstance.ephemeral()).success
    pinned_at = main_snapshot(platform, "silver.orders")

    run_id = str(uuid.uuid4())
    pins.record(platform, run_id, {"silver.orders": pinned_at})  # the run pinned silver.orders here...
    spark = platform.spark()  # ...then another writer moved main
    spark.createDataFrame([(7, 1, 99.0)], "order_id bigint, customer_id bigint, amount double") \
        .writeTo(f"{platform.settings.catalog_name}.silver.orders").append()
    assert main_snapshot(platform, "silver.orders") != pinned_at

    res = _job(platform).execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), run_id=run_id,
        asset_selection=[dg.AssetKey(["gold", "big_orders"])])
    assert res.success
    # the gold stage's input (loaded by the IO manager) was silver.orders at the pin: order 7 is not in it
    assert sorted(r["order_id"] for r in rows_of(platform, "gold.big_orders")) == [1]
    cat = pyiceberg(platform)
    summary = cat.load_table("gold.big_orders").current_snapshot().summary
    assert str(pinned_at) in (summary.additional_properties.get("lakehouse.upstream") or "")


def test_failed_blocking_audit_is_no_materialization(platform, tmp_path):
    """A failed blocking rule fails the load op before its output exists: the instance's event log
    holds the failed check evaluation and no materialization of the asset, main is unchanged and the
    audit branch is kept. A passing audit materializes once, with its checks after (and about) it."""
    from dagster import DagsterEventType
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    from lakehouse.table.iceberg import branch_name_for_run

    apply_rules(platform, tmp_path, RULES, base=PYTHON_STAGE)
    land_customers(platform)
    land(platform, "orders", "b1", [order(1, amount=25.0)])
    instance, job = dg.DagsterInstance.ephemeral(), _job(platform)
    bronze = dg.AssetKey(["bronze", "orders"])
    check = dg.AssetCheckKey(bronze, "id_present")

    def events(run_id, kind):
        entries = [r.event_log_entry for r in instance.get_records_for_run(run_id, of_type=kind).records]
        return [e for e in entries if bronze in (e.dagster_event.asset_key,
                                                 getattr(e.dagster_event.event_specific_data, "asset_key", None))]

    good = job.execute_in_process(instance=instance)
    assert good.success
    [mat] = events(good.run_id, DagsterEventType.ASSET_MATERIALIZATION)
    [passed] = events(good.run_id, DagsterEventType.ASSET_CHECK_EVALUATION)
    evaluation = passed.dagster_event.event_specific_data
    assert evaluation.passed and evaluation.target_materialization_data.run_id == good.run_id
    assert passed.timestamp >= mat.timestamp  # the check reports on the materialization it follows
    before = main_snapshot(platform, "bronze.orders")

    land(platform, "orders", "b2", [order(None, amount=30.0)])  # an order without id: id_present fails
    bad = job.execute_in_process(instance=instance, raise_on_error=False)
    assert not bad.success
    assert events(bad.run_id, DagsterEventType.ASSET_MATERIALIZATION) == []
    assert [r.run_id for r in instance.fetch_materializations(bronze, limit=10).records] == [good.run_id]
    [failed] = [e.dagster_event.event_specific_data for e in events(bad.run_id, DagsterEventType.ASSET_CHECK_EVALUATION)]
    assert (failed.check_name, failed.passed, failed.severity, failed.blocking) == (
        "id_present", False, dg.AssetCheckSeverity.ERROR, True)
    # what the asset-check dashboard reads: the latest execution of the check failed, in the bad run,
    # against the asset's latest materialization (the good run's: what main still holds)
    [latest] = instance.event_log_storage.get_asset_check_execution_history(check, limit=1)
    assert (latest.run_id, latest.status) == (bad.run_id, AssetCheckExecutionRecordStatus.FAILED)
    assert failed.target_materialization_data.run_id == good.run_id
    [step_failure] = [e for e in bad.all_events if e.event_type_value == "STEP_FAILURE"]
    branch = branch_name_for_run(bad.run_id)
    assert step_failure.step_key.endswith("orders__load")
    assert step_failure.event_specific_data.error_display_string.count("id_present") >= 1
    assert main_snapshot(platform, "bronze.orders") == before  # main untouched
    assert branch in pyiceberg(platform).load_table("bronze.orders").metadata.refs  # the audit branch kept
    assert sorted(r["order_id"] for r in rows_of(platform, "bronze.orders")) == [1]
