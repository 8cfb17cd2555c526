"""Write-audit-publish guarantees: readers of main never see an unaudited snapshot while a run is
in progress, and two runs writing the same table at once both publish without losing rows."""

from __future__ import annotations

import threading
import time

from lakehouse.engines import audited
from lakehouse.engines.spark.write import SparkAuditedWrite as AuditedWrite
from lakehouse.stage.runner import Batch, StageRunner
from tests.test_wap_helpers import apply, checks, land, main_snapshot, order, pyiceberg, rows_of, run

RULES = """
- {name: order_id_unique, type: unique, columns: [order_id], severity: error}
- {name: id_present, type: not_null, columns: [order_id], severity: error}
"""


def test_main_unchanged_between_branch_write_and_publish(platform, tmp_path, monkeypatch):
    apply(platform, tmp_path, RULES)
    land(platform, "orders", "b1", [order(1), order(2)])
    assert run(platform).success
    s1 = main_snapshot(platform, "bronze.orders")

    seen: dict = {}
    polled: set = set()
    stop = threading.Event()

    def poll_main():  # an independent reader (PyIceberg) watching main for the whole run
        while not stop.is_set():
            polled.add(main_snapshot(platform, "bronze.orders"))
            time.sleep(0.05)

    audit = AuditedWrite.audit
    publish = audited.publish_branches  # the publish of a staged write, from its reference (lakehouse.stage)

    def spy_audit(self):
        if self.ident != "bronze.orders":
            return audit(self)
        seen["main_at_audit"] = main_snapshot(platform, "bronze.orders")
        seen["main_rows_at_audit"] = len(rows_of(platform, "bronze.orders"))
        seen["branch_rows_at_audit"] = len(rows_of(platform, "bronze.orders", self.branch))
        return audit(self)

    def spy_publish(platform_, tables, ident, branch, **kwargs):
        if ident == "bronze.orders":
            seen["main_before_publish"] = main_snapshot(platform, "bronze.orders")
            seen["branch_head"] = pyiceberg(platform).load_table("bronze.orders").metadata.refs[branch].snapshot_id
        return publish(platform_, tables, ident, branch, **kwargs)

    monkeypatch.setattr(AuditedWrite, "audit", spy_audit)
    monkeypatch.setattr(audited, "publish_branches", spy_publish)
    land(platform, "orders", "b2", [order(3), order(4), order(5)])
    poller = threading.Thread(target=poll_main, daemon=True)
    poller.start()
    try:
        res = run(platform)
    finally:
        stop.set()
        poller.join(timeout=10)
    assert res.success
    assert seen["main_at_audit"] == s1 and seen["main_rows_at_audit"] == 2
    assert seen["branch_rows_at_audit"] == 5
    assert seen["main_before_publish"] == s1
    final = main_snapshot(platform, "bronze.orders")
    assert final == seen["branch_head"]  # fast-forward: main jumped straight to the audited head
    assert polled <= {s1, final}  # no intermediate, unaudited snapshot was ever visible on main
    assert s1 in polled


def test_two_concurrent_runs_both_publish_without_losing_rows(platform, tmp_path):
    apply(platform, tmp_path, RULES)
    land(platform, "orders", "b0", [order(1)])
    assert run(platform).success
    spark = platform.spark()
    schema = spark.table(platform.tables().qualified("bronze.orders")).schema
    written = threading.Barrier(2)
    outcomes: dict = {}
    errors: list = []

    def batches(chunks):
        for ids in chunks:
            rows = [tuple(order(i).get(f.name) for f in schema.fields) for i in ids]
            yield Batch(spark.createDataFrame(rows, schema), label=f"{len(ids)} rows")
        written.wait(timeout=300)  # both runs wrote their branches before either audits/publishes

    def work(run_id, chunks):
        try:
            runner = StageRunner(platform, "orders_etl", "ingest", run_id)
            outcomes[run_id] = runner.wap().run(batches(chunks))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(f"{run_id}: {exc}"[:3000])
            written.abort()

    a = threading.Thread(target=work, args=("run_a", [range(100, 150), range(150, 200)]))
    b = threading.Thread(target=work, args=("run_b", [range(200, 260)]))
    a.start()
    b.start()
    a.join(timeout=600)
    b.join(timeout=600)
    assert not errors, errors
    assert outcomes["run_a"].published and outcomes["run_b"].published
    assert all(c.passed for o in outcomes.values() for c in o.checks)

    ids = sorted(r["order_id"] for r in rows_of(platform, "bronze.orders"))
    assert ids == [1, *range(100, 260)]
    table = pyiceberg(platform).load_table("bronze.orders")
    assert set(table.metadata.refs) == {"main"}  # both audit branches published and dropped
    # one run fast-forwarded, the other was rebased on top of it: its data files appended to main
    # in one compare-and-swap commit (lakehouse.table.publish), the branch's own commits removed
    main_lineage = []
    snap = table.current_snapshot()
    while snap is not None:
        main_lineage.append(snap)
        snap = table.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    rebased = [s for s in main_lineage if "lakehouse.publish_token" in s.summary.additional_properties]
    assert len(rebased) == 1


def test_checks_are_asset_checks_in_the_job(platform, tmp_path):
    apply(platform, tmp_path, RULES)
    land(platform, "orders", "b1", [order(1)])
    res = run(platform)
    assert res.success
    assert {n: e.passed for n, e in checks(res).items()} == {"order_id_unique": True, "id_present": True}
