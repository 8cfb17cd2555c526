"""Deliberately bad batches through the Dagster job: a failed error rule leaves `main` exactly
where it was (same snapshot id), downstream assets are not materialized in that run, and the
audit branch is kept with the batch on it and listed by `lakehouse branches list`."""

from __future__ import annotations

import pytest

from tests.test_wap_helpers import (
    apply,
    checks,
    cli,
    land,
    main_snapshot,
    materialized,
    md,
    order,
    rows_of,
    run,
)

STRICT_RULES = """
- {name: id_present, type: not_null, columns: [order_id], severity: error, action: fail}
- {name: amount_range, type: range, column: amount, min: 0, max: 10000, severity: error}
- {name: order_id_unique, type: unique, columns: [order_id], severity: error}
- {name: fresh, type: freshness, column: order_ts, max_age_seconds: 3600, severity: error}
- name: contract
  type: schema_contract
  schema_policy: fail
  severity: error
  expected_columns:
    - {name: order_id, type: bigint}
    - {name: customer_id, type: bigint}
    - {name: amount, type: double}
    - {name: status, type: string}
    - {name: email, type: string}
    - {name: order_ts, type: timestamp}
"""

BAD = {
    "nulls": ([order(10), order(None), order(None)], "id_present", 2),
    "out_of_range": ([order(10), order(11, amount=99999.0)], "amount_range", 1),
    "duplicates": ([order(10), order(10), order(1)], "order_id_unique", 4),  # 10 twice, 1 also in batch 1
    "schema_drift": ([order(10, coupon="X"), order(11, coupon="Y")], "contract", 0),
    "late_data": ([order(10, age_s=10 * 86400), order(11, age_s=9 * 86400)], "fresh", 2),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_batch_leaves_main_untouched(platform, tmp_path, case):
    apply(platform, tmp_path, STRICT_RULES)
    land(platform, "orders", "good", [order(1), order(2), order(3)])
    good = run(platform)
    assert good.success and all(c.passed for c in checks(good).values())
    before = main_snapshot(platform, "bronze.orders")
    silver_before = main_snapshot(platform, "silver.orders")

    rows, rule, failed_rows = BAD[case]
    land(platform, "orders", "bad", rows)
    bad = run(platform)
    assert not bad.success
    ev = checks(bad)
    assert ev[rule].passed is False
    assert md(ev[rule])["failed_rows"] == failed_rows
    assert [n for n, e in ev.items() if not e.passed] == [rule]  # nothing else was blamed

    assert main_snapshot(platform, "bronze.orders") == before
    assert sorted(r["order_id"] for r in rows_of(platform, "bronze.orders")) == [1, 2, 3]
    assert "silver/orders" not in materialized(bad)
    assert main_snapshot(platform, "silver.orders") == silver_before

    branch = "audit_" + bad.run_id.replace("-", "_")
    kept = rows_of(platform, "bronze.orders", branch)
    assert len(kept) == 3 + len(rows)  # the whole batch is there to inspect
    rc, out = cli("branches", "list", "bronze.orders")
    assert rc == 0 and branch in out
    if case == "schema_drift":
        assert "unexpected new column(s) ['coupon']" in md(ev[rule])["message"]
    rc, out = cli("branches", "drop", "bronze.orders", branch)
    assert rc == 0
    rc, out = cli("branches", "list", "bronze.orders")
    assert branch not in out
