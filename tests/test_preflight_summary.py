"""The pre-run check against the live catalog, the run summary's content, and reading the tables
with DuckDB — all without Spark (PyIceberg writes the tables these tests read)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import load_metadata
from lakehouse.runtime.preflight import problems_for
from lakehouse.stage.run_summary import FAILED, STOPPED, SUCCESS, WARNINGS, CheckReport, RunSummary, StageReport
from tests.conftest import seed_control_db
from tests.test_static_checks import SHOP, shop

SHOP_NO_COLUMNS = SHOP.replace("""    columns:
      - {name: order_id, type: bigint}
      - {name: customer_id, type: bigint}
      - {name: amount, type: "decimal(10,2)"}
      - {name: order_ts, type: timestamp}
""", "")


@pytest.fixture
def home(tmp_path, monkeypatch, control_db_at_head) -> Path:
    h = tmp_path / "home"
    seed_control_db(control_db_at_head, h)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(h))
    for v in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME",
              "DAGSTER_HOME"):
        monkeypatch.delenv(v, raising=False)
    return h


def make_table(home: Path, ident: str, schema: pa.Schema, rows: dict) -> None:
    """A real Iceberg table in the home's embedded catalog, written by PyIceberg."""
    from lakehouse.settings import load_settings
    from lakehouse.table.catalog import pyiceberg_catalog

    cat = pyiceberg_catalog(load_settings())
    ns = ident.split(".")[0]
    if (ns,) not in cat.list_namespaces():
        cat.create_namespace(ns)
    table = cat.create_table(ident, schema=schema)
    table.append(pa.table(rows, schema=schema))
    cat.engine.dispose()


def files_state(home: Path) -> dict[str, str]:
    return {str(p.relative_to(home)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(home.rglob("*"))
            if p.is_file()}


ORDERS = pa.schema([("order_id", pa.int64()), ("customer_id", pa.int64()), ("amount", pa.float64()),
                    ("order_ts", pa.timestamp("us"))])


def test_validate_checks_against_the_live_catalog_read_only(home, tmp_path, capsys):
    """bronze.orders exists without `amount`; the files source declares no columns, so only the live
    table can tell that silver's SQL reads a column that is not there. The catalog is not touched."""
    no_amount = pa.schema([f for f in ORDERS if f.name != "amount"])
    make_table(home, "bronze.orders", no_amount, {"order_id": [1], "customer_id": [2], "order_ts": [None]})
    meta = shop(tmp_path, SHOP_NO_COLUMNS)
    before = files_state(home)
    assert cli(["metadata", "validate", str(meta)]) == 2
    err = capsys.readouterr().err
    assert ("reads column 'amount', which none of its tables has (bronze.orders: order_id, customer_id, order_ts)"
            in err), err
    assert files_state(home) == before  # not even a -wal / -shm file


def test_preflight_sees_what_changed_since_validate(tmp_path):
    cat = load_metadata(shop(tmp_path)).catalog
    stages = cat.stages_of("shop")
    # a run of the whole pipeline: every planned table follows the metadata, nothing to object
    assert problems_for(cat, stages, {}) == []
    # a run of gold alone: silver.orders does not exist, and this run does not write it
    gold = [cat.stage("shop", "sales")]
    (msg,) = problems_for(cat, gold, {})
    assert msg == ("control DB stages['shop', 4]: stage shop.sales reads silver.orders, which does not exist yet "
                   "and is not written by this run. Fix: run stage shop.clean_orders first, or in the same run")
    # silver.orders was rebuilt by hand without order_day since the metadata was validated
    (msg,) = problems_for(cat, gold, {"silver.orders": {"order_id": "bigint", "revenue_total": "double"}})
    assert msg.startswith("control DB stages['shop', 4].transformation: the SQL at line 1, column 8 reads column "
                          "'order_day', which none of its tables has (silver.orders: order_id, revenue_total)")
    # a rule edited with plain SQL in the control DB (never validated) is caught too
    rs = cat.rule_set("silver_rules")
    rs.rules[0].columns = ["order_timestamp"]
    probs = problems_for(cat, stages, {})
    assert probs == ["control DB validation_rules['silver_rules'].rules[0]: rule 'ts_present' (stage "
                     "shop.clean_orders) checks column(s) ['order_timestamp'], which silver.orders does not have (its "
                     "columns: order_id, customer_id, amount, order_day, from its SQL). Fix: use one of those columns, "
                     "or make the stage output it"]


def summary_with_warn_quarantine_and_skip() -> RunSummary:
    return RunSummary("r1", "shop_job", [
        StageReport("bronze/orders", "shop.ingest_orders", materialized=True, rows_written=97, quarantined=3,
                    snapshot_id="111", files_quarantined=1, checks=[CheckReport("id_present", False, "warn", 3, "3 of 100 quarantined"),
                                               CheckReport("not_empty", True, "error", 0)]),
        StageReport("bronze/customers", "shop.ingest_customers", materialized=True, rows_written=0, rows_read=0,
                    skipped_reason="no new rows in source 'customers_db'", snapshot_id="222",
                    checks=[CheckReport("pk_unique", True, "error", evaluated=False)]),
        StageReport("silver/orders", "shop.clean_orders", materialized=True, rows_written=90, dropped=7,
                    rows_inserted=5, rows_updated=85, rows_deleted=0, rows_rewritten=4000,
                    snapshot_id="333", checks=[CheckReport("amount_small", False, "warn", 2, "2 of 90 rows fail")]),
    ])


def test_run_summary_rows_outcome_and_exit_code():
    s = summary_with_warn_quarantine_and_skip()
    # the ecosystem's convention (dbt, SQLMesh): warnings exit 0; --warn-error makes them exit 3
    assert s.outcome == WARNINGS and s.exit_code == 0
    s.warn_error = True
    assert s.exit_code == 3 and s.table().splitlines()[0].endswith("SUCCESS with warnings (warnings are errors: "
                                                                   "--warn-error)")
    s.warn_error = False
    assert s.rows() == [
        {"asset": "bronze/orders", "status": "published", "read": "100", "inserted": "97", "updated": "0",
         "deleted": "0", "quarantined": 3, "files q.": 1, "snapshot / branch": "snapshot 111"},
        {"asset": "bronze/customers", "status": "skipped", "read": "0", "inserted": "0", "updated": "0",
         "deleted": "0", "quarantined": 0, "files q.": 0, "snapshot / branch": "snapshot 222"},
        {"asset": "silver/orders", "status": "published", "read": "97", "inserted": "5", "updated": "85",
         "deleted": "0", "quarantined": 0, "files q.": 0, "snapshot / branch": "snapshot 333"}]
    table = s.table()
    assert table.splitlines()[0] == "run r1 (shop_job): SUCCESS with warnings"
    assert table.splitlines()[1].split() == ["asset", "status", "read", "inserted", "updated", "deleted",
                                             "quarantined", "files", "q.", "snapshot", "/", "branch"]
    # the files quarantined in this run, their reasons one command away
    assert "    files quarantined: 1 (why: lakehouse audit --run-id r1 --event file_quarantined)" in table
    assert "    checks: id_present warn 3 failing; not_empty ok" in table
    assert "    skipped: no new rows in source 'customers_db'" in table
    assert "    checks: pk_unique not evaluated" in table
    tags = s.tags()
    assert tags["lakehouse/outcome"] == WARNINGS
    assert json.loads(tags["lakehouse/summary"])[0]["checks"] == {"id_present": "warn:3", "not_empty": "ok"}
    # the physical rows rewritten stay available on their own
    assert {k: json.loads(tags["lakehouse/summary"])[2][k] for k in ("inserted", "updated", "rewritten")} == {
        "inserted": 5, "updated": 85, "rewritten": 4000}

    s.stages[2] = StageReport("silver/orders", failed=True, failure="blocking rule(s) amount_small",
                              branch="audit_r1", snapshot_id=None,
                              checks=[CheckReport("amount_small", False, "error", 2)])
    s.stages.append(StageReport("gold/sales"))
    assert s.outcome == FAILED and s.exit_code == 1
    text = s.table()
    assert "silver/orders     failed" in text and "branch audit_r1 kept" in text
    assert "    failed: blocking rule(s) amount_small" in text and "amount_small FAILED 2 failing" in text
    assert "gold/sales        not run" in text
    assert RunSummary("r2", "j", [StageReport("a/b", materialized=True, rows_written=1)]).outcome == SUCCESS
    stopped = RunSummary("-", "shop", [], stopped="pipeline shop disabled by cli at 2026-01-01 00:00:00 UTC")
    assert stopped.outcome == STOPPED and stopped.exit_code == 4 and stopped.table() == (
        "stopped: pipeline shop disabled by cli at 2026-01-01 00:00:00 UTC")


def test_tables_are_readable_with_duckdb_as_the_readme_shows(tmp_path, monkeypatch, capsys):
    """The README's DuckDB snippet, run as written (offline: the extension comes from the installed
    duckdb-ext-* wheels), reads a real Iceberg table of the embedded catalog."""
    home = tmp_path / ".lakehouse"
    home.mkdir()
    monkeypatch.setenv("LAKEHOUSE_HOME", str(home))
    for v in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME"):
        monkeypatch.delenv(v, raising=False)
    daily = pa.schema([("event_date", pa.date32()), ("total_events", pa.int64()), ("unique_users", pa.int64())])
    import datetime as dt

    make_table(home, "gold.daily_user_events", daily, {"event_date": [dt.date(2024, 1, 1), dt.date(2024, 1, 2)],
                                                       "total_events": [10, 20], "unique_users": [3, 4]})
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    snippet = readme.split("<!-- duckdb -->")[1].split("```python")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md (duckdb)", "exec"), {})  # noqa: S102 - our own documentation
    out = capsys.readouterr().out.strip()
    assert out == "[(datetime.date(2024, 1, 1), 10, 3), (datetime.date(2024, 1, 2), 20, 4)]"


@pytest.mark.parametrize("bad", ["SELECT 1 AS x; SELECT 2", "DROP TABLE silver.orders"])
def test_inline_sql_problems_name_the_yaml_key(tmp_path, bad):
    meta = shop(tmp_path, SHOP.replace('"SELECT order_day, sum(amount) AS revenue FROM silver.orders GROUP BY '
                                       'order_day"', json.dumps(bad)))
    from lakehouse.metadata.loader import MetadataError

    with pytest.raises(MetadataError) as exc:
        load_metadata(meta)
    (msg,) = exc.value.problems
    assert msg.startswith(f"{meta / 'shop.yaml'}: stages[3].transformation: the stage's SQL ")



THROTTLED = SHOP + """
throttles:
  - {throttle_id: one_reader, entity_type: source, entity_id: orders_raw, metric: max_concurrent, threshold: 1}
"""


def test_apply_syncs_the_headless_instance_and_says_what_is_not_enforced(home, tmp_path, monkeypatch, capsys):
    import dagster as dg

    meta = shop(tmp_path, THROTTLED)
    monkeypatch.setenv("LAKEHOUSE_DAGSTER_EPHEMERAL", "1")
    assert cli(["metadata", "apply", str(meta)]) == 0
    err = capsys.readouterr().err
    assert ("warning: throttle source:orders_raw (max_concurrent 1) is NOT enforced: LAKEHOUSE_DAGSTER_EPHEMERAL is "
            "set") in err
    assert not (home / "dagster_home").exists()

    monkeypatch.delenv("LAKEHOUSE_DAGSTER_EPHEMERAL")
    assert cli(["metadata", "apply", str(meta)]) == 0
    out, err = capsys.readouterr()
    assert f"dagster pools ({home / 'dagster_home'}): set source:orders_raw=1" in out and "NOT enforced" not in err
    template = Path(__file__).resolve().parent.parent / "deploy" / "dagster.dev.yaml"
    # the template, its storage under this home by path (nothing writes DAGSTER_HOME into the environment)
    assert (home / "dagster_home" / "dagster.yaml").read_text() == template.read_text().replace(
        "{env: DAGSTER_HOME}", json.dumps(str(home / "dagster_home")))
    assert "DAGSTER_HOME" not in os.environ
    instance = dg.DagsterInstance.from_config(str(home / "dagster_home"))
    assert {p.name: p.limit for p in instance.event_log_storage.get_pool_limits()}["source:orders_raw"] == 1
    from lakehouse.orchestration.instance import unenforced

    cat = load_metadata(meta).catalog
    assert unenforced(cat, instance) == []
    instance.event_log_storage.set_concurrency_slots("source:orders_raw", 3)  # changed behind our back
    assert unenforced(cat, instance) == ["throttle source:orders_raw (max_concurrent 1) is NOT enforced: the "
                                         "instance's pool limit is 3; run `lakehouse pools sync`"]


def test_slots_of_a_killed_headless_run_are_freed(home, tmp_path, monkeypatch):
    """kill -9 of a `lakehouse run` leaves its pool slot claimed and no daemon to free it: the next
    headless run frees the slots of runs whose process on this host is gone."""
    import socket
    import subprocess

    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

    from lakehouse.orchestration.instance import HOST_TAG, PID_TAG, free_stale_slots

    dh = home / "dagster_home"
    dh.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(dh))
    (dh / "dagster.yaml").write_text((Path(__file__).resolve().parent.parent / "deploy" / "dagster.dev.yaml")
                                     .read_text())
    instance = dg.DagsterInstance.get()
    storage = instance.event_log_storage
    storage.set_concurrency_slots("source:s", 1)
    gone = subprocess.Popen(["true"])
    gone.wait()
    alive_run = instance.add_run(DagsterRun(job_name="j", run_id="a" * 32, status=DagsterRunStatus.STARTED,
                                            tags={PID_TAG: str(__import__("os").getpid()),
                                                  HOST_TAG: socket.gethostname()}))
    dead_run = instance.add_run(DagsterRun(job_name="j", run_id="d" * 32, status=DagsterRunStatus.STARTED,
                                           tags={PID_TAG: str(gone.pid), HOST_TAG: socket.gethostname()}))
    storage.set_concurrency_slots("source:t", 1)
    assert storage.claim_concurrency_slot("source:s", dead_run.run_id, "x__extract").is_claimed
    assert storage.claim_concurrency_slot("source:t", alive_run.run_id, "y__extract").is_claimed
    assert free_stale_slots(instance) == [dead_run.run_id]
    assert storage.get_concurrency_info("source:s").claimed_slots == []
    assert len(storage.get_concurrency_info("source:t").claimed_slots) == 1  # a live run keeps its slot
    assert instance.get_run_by_id(dead_run.run_id).status == DagsterRunStatus.FAILURE


def test_preflight_reads_only_the_tables_of_its_stages(tmp_path):
    cat = load_metadata(shop(tmp_path)).catalog
    asked: list[str] = []

    class Recorder(dict):
        def get(self, key, default=None):
            asked.append(key)
            return super().get(key, default)

    assert problems_for(cat, [cat.stage("shop", "ingest_orders")], Recorder()) == []
    assert set(asked) == {"bronze.orders"}
    asked.clear()
    problems_for(cat, [cat.stage("shop", "sales")], Recorder({"silver.orders": {"order_day": "date",
                                                                                 "amount": "double"}}))
    assert set(asked) == {"silver.orders", "gold.sales"}  # not bronze: silver is read as it is now


def test_audit_lists_a_runs_quarantined_files_and_why(settings, capsys):
    """The run summary's hint, run as printed: `lakehouse audit --run-id R --event file_quarantined`
    lists that run's quarantined files with their reasons, and nothing else."""
    from lakehouse.platform import Platform

    store = Platform.from_env().store
    store.audit(run_id="r9", pipeline_id="p", stage_name="s", dataset="bronze.t", event="file_quarantined",
                outcome="quarantined", error_class="CorruptFile", message="day3.jsonl: truncated JSON at line 7")
    store.audit(run_id="r9", pipeline_id="p", stage_name="s", dataset="bronze.t", event="published",
                outcome="success")
    store.audit(run_id="r8", pipeline_id="p", stage_name="s", dataset="bronze.t", event="file_quarantined",
                outcome="quarantined", message="day1.jsonl: other run")
    capsys.readouterr()
    assert cli(["audit", "--run-id", "r9", "--event", "file_quarantined"]) == 0
    out = capsys.readouterr().out
    assert "day3.jsonl: truncated JSON at line 7" in out and "CorruptFile" in out
    assert "published" not in out and "day1.jsonl" not in out
