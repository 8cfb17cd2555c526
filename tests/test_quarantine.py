"""Quarantine end to end: rows failing quarantine rules land next to the dataset with every
rule they failed, the run id and the time; after the rule is fixed, `lakehouse quarantine
replay` re-validates them and moves the passing ones into the dataset through write-audit-publish."""

from __future__ import annotations

from lakehouse.validation.history import check_history
from tests.test_wap_helpers import (
    apply,
    checks,
    cli,
    land,
    main_snapshot,
    md,
    order,
    pyiceberg,
    rows_of,
    run,
)

RULES = """
- {name: id_present, type: not_null, columns: [order_id], severity: warn, action: quarantine}
- {name: status_known, type: accepted_values, column: status, values: [new, paid, shipped], severity: warn,
   action: quarantine}
- {name: amount_range, type: range, column: amount, min: 0, max: 10000, severity: warn, action: quarantine}
- {name: order_id_unique, type: unique, columns: [order_id], severity: error}
"""


def test_quarantine_then_replay_after_fixing_the_rule(platform, tmp_path):
    apply(platform, tmp_path, RULES)
    land(platform, "orders", "b1", [
        order(1), order(2), order(3), order(4),
        order(None),                              # id_present
        order(5, status="lost"),                  # status_known
        order(6, status="lost", amount=-1.0),     # status_known + amount_range
    ])
    res = run(platform)
    assert res.success
    ev = checks(res)
    assert (ev["status_known"].passed, md(ev["status_known"])["failed_rows"]) == (False, 2)
    assert sorted(r["order_id"] for r in rows_of(platform, "bronze.orders")) == [1, 2, 3, 4]
    mats = {e.asset_key.to_user_string(): e.materialization for e in res.get_asset_materialization_events()}
    assert mats["bronze/orders"].metadata["quarantined_rows"].value == 3

    q = rows_of(platform, "bronze.orders__quarantine")
    by_id = {r["order_id"]: r for r in q}
    assert by_id[None]["_failed_rules"] == ["id_present"]
    assert by_id[5]["_failed_rules"] == ["status_known"]
    assert by_id[6]["_failed_rules"] == ["status_known", "amount_range"]
    assert {r["_run_id"] for r in q} == {res.run_id}
    assert all(r["_quarantined_at"] is not None and r["_quarantine_id"] for r in q)

    rc, out = cli("quarantine", "show", "bronze_orders", "--rows", "0")
    assert rc == 0
    assert any(" status_known " in f" {ln} " and " 2 " in f" {ln} " for ln in out.splitlines())

    # nothing changed yet: replay moves nothing and leaves main alone
    before = main_snapshot(platform, "bronze.orders")
    rc, out = cli("quarantine", "replay", "bronze.orders")
    assert rc == 0 and "replayed 0 of 3" in out
    assert main_snapshot(platform, "bronze.orders") == before

    # fix the rule ('lost' is a real status after all) and replay
    apply(platform, tmp_path, RULES.replace("[new, paid, shipped]", "[new, paid, shipped, lost]"))
    rc, out = cli("quarantine", "replay", "bronze_orders")
    assert rc == 0, out
    assert "replayed 1 of 3" in out and "2 still failing" in out
    assert "amount_range=1" in out and "id_present=1" in out
    assert sorted(r["order_id"] for r in rows_of(platform, "bronze.orders")) == [1, 2, 3, 4, 5]
    left = rows_of(platform, "bronze.orders__quarantine")
    assert sorted((r["order_id"] or 0) for r in left) == [0, 6]

    # through the audit path: a published snapshot of the replay run, its checks in the history
    snap = pyiceberg(platform).load_table("bronze.orders").current_snapshot()
    assert snap.summary.additional_properties["lakehouse.replay_of"] == "bronze.orders__quarantine"
    replay_run = snap.summary.additional_properties["lakehouse.run_id"]
    assert replay_run.startswith("replay_")
    hist = [h for h in check_history(platform.store, dataset="bronze.orders") if h["run_id"] == replay_run]
    assert {h["rule"] for h in hist} == {"id_present", "status_known", "amount_range", "order_id_unique"}
    assert all(h["passed"] for h in hist)
    refs = pyiceberg(platform).load_table("bronze.orders").metadata.refs
    assert set(refs) == {"main"}  # the replay's audit branch was published and dropped

    # replaying again is a no-op
    rc, out = cli("quarantine", "replay", "bronze_orders")
    assert rc == 0 and "replayed 0 of 2" in out
    assert sorted(r["order_id"] for r in rows_of(platform, "bronze.orders")) == [1, 2, 3, 4, 5]


def test_replay_that_fails_the_audit_moves_nothing(platform, tmp_path):
    apply(platform, tmp_path, RULES)
    land(platform, "orders", "b1", [order(1), order(2), order(2, status="lost")])
    assert run(platform).success
    before = main_snapshot(platform, "bronze.orders")
    # fixing status_known makes order 2 a duplicate: the unique rule (error) blocks the replay
    apply(platform, tmp_path, RULES.replace("[new, paid, shipped]", "[new, paid, shipped, lost]"))
    rc, out = cli("quarantine", "replay", "bronze_orders")
    assert rc == 1 and "order_id_unique" in out and "main is unchanged" in out
    assert main_snapshot(platform, "bronze.orders") == before
    assert [r["order_id"] for r in rows_of(platform, "bronze.orders__quarantine")] == [2]


def test_unknown_dataset_is_a_clear_error(platform, tmp_path, capsys):
    apply(platform, tmp_path, RULES)
    rc, _ = cli("quarantine", "replay", "no_such_dataset")
    assert rc == 2
    assert "unknown dataset 'no_such_dataset'" in capsys.readouterr().err
