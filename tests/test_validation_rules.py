"""Every rule type through the Dagster job on real Spark + Iceberg: counts, samples and the
rule's expression in the asset check metadata, history rows, and the blocking outcome."""

from __future__ import annotations

import textwrap

import pytest

from lakehouse.validation.history import check_history
from tests.test_wap_helpers import (
    apply,
    checks,
    cli,
    land,
    land_customers,
    main_snapshot,
    materialized,
    md,
    order,
    pyiceberg,
    rows_of,
    run,
)

EXPECTED = """
expected_columns:
  - {name: order_id, type: bigint}
  - {name: customer_id, type: bigint}
  - {name: amount, type: double}
  - {name: status, type: string}
  - {name: email, type: string}
  - {name: order_ts, type: timestamp}
"""

ALL_RULES = """
- {name: loaded_rows, type: row_count, min: 1, max: 5, severity: error}
- {name: growth, type: row_count_change, max_change_pct: 50, severity: warn}
- {name: fresh, type: freshness, column: order_ts, max_age_seconds: 3600, severity: error}
- name: contract
  type: schema_contract
  schema_policy: evolve
  severity: error
  expected_columns:
    - {name: order_id, type: bigint, nullable: true}
    - {name: customer_id, type: bigint}
    - {name: amount, type: double}
    - {name: status, type: string}
    - {name: email, type: string}
    - {name: order_ts, type: timestamp}
- {name: order_id_unique, type: unique, columns: [order_id], severity: error}
- {name: customer_known, type: referential_integrity, columns: [customer_id], ref_dataset: bronze_customers,
   ref_columns: [customer_id], severity: error}
- {name: id_present, type: not_null, columns: [order_id], severity: warn, action: quarantine}
- {name: status_known, type: accepted_values, column: status, values: [new, paid, shipped], severity: warn,
   action: quarantine}
- {name: amount_range, type: range, column: amount, min: 0, max: 10000, severity: warn, action: quarantine}
- {name: email_format, type: regex, column: email, pattern: "^[^@]+@[^@]+$", severity: warn, action: warn}
- {name: amount_cap, type: expression, expression: "amount <= 1000", severity: warn, action: warn}
"""


def test_every_rule_type_reports_counts_samples_and_expression(platform, tmp_path):
    apply(platform, tmp_path, ALL_RULES)
    land_customers(platform, ids=(1, 2, 3))
    assert run(platform, "customers_etl").success

    land(platform, "orders", "b1", [order(i, customer_id=1 + i % 3) for i in range(1, 6)])
    first = run(platform)
    assert first.success, [c.check_name for c in checks(first).values() if not c.passed]
    assert all(c.passed for c in checks(first).values())
    assert {"bronze/orders", "silver/orders"} <= materialized(first)
    s1 = main_snapshot(platform, "bronze.orders")

    bad = [
        order(None, coupon="X"),                               # id_present -> quarantined
        order(8, status="lost", coupon="X"),                   # status_known -> quarantined
        order(9, status="bogus", amount=-5.0, coupon="X"),     # status_known + amount_range -> quarantined
        order(10, email="nope", coupon="X"),                   # email_format (warn)
        order(3, coupon="X"),                                  # duplicate of batch 1 -> unique (error)
        order(11, customer_id=99, coupon="X"),                 # orphan -> referential integrity (error)
        order(12, amount=5000.0, coupon="X"),                  # amount_cap expression (warn)
        order(13, coupon="X"),
        order(14, coupon="X"),
    ]
    land(platform, "orders", "b2", bad)
    second = run(platform)
    assert not second.success
    ev = checks(second)
    assert set(ev) == {"loaded_rows", "growth", "fresh", "contract", "order_id_unique", "customer_known",
                       "id_present", "status_known", "amount_range", "email_format", "amount_cap"}

    def outcome(name):
        return ev[name].passed, md(ev[name])["failed_rows"], md(ev[name])["total_rows"]

    # row rules with drop/quarantine actions count the 9 input rows; the rest see the 6 rows written
    assert outcome("id_present") == (False, 1, 9)
    assert outcome("status_known") == (False, 2, 9)
    assert outcome("amount_range") == (False, 1, 9)
    assert outcome("email_format") == (False, 1, 6)
    assert outcome("amount_cap") == (False, 1, 6)
    assert outcome("order_id_unique") == (False, 2, 11)  # order 3 twice in what main would become
    assert outcome("customer_known") == (False, 1, 6)
    assert outcome("loaded_rows")[0] is False and outcome("loaded_rows")[2] == 6
    assert outcome("fresh")[0] is True
    assert ev["contract"].passed is True
    assert md(ev["contract"])["details"]["added"] == ["coupon"]

    growth = md(ev["growth"])
    assert ev["growth"].passed is False
    assert growth["details"]["previous_rows"] == 5 and growth["details"]["rows"] == 11
    assert growth["details"]["change_pct"] == pytest.approx(120.0)

    # expressions: quoted identifiers and literals, exactly as a person would run them
    assert md(ev["status_known"])["rule_expression"] == "`status` IN ('new', 'paid', 'shipped')"
    assert md(ev["amount_range"])["rule_expression"] == "`amount` >= 0.0 AND `amount` <= 10000.0"
    assert md(ev["email_format"])["rule_expression"] == "`email` RLIKE '^[^@]+@[^@]+$'"
    assert md(ev["amount_cap"])["rule_expression"] == "amount <= 1000"
    assert md(ev["id_present"])["rule_expression"] == "`order_id` IS NOT NULL"
    # samples are the failing rows
    assert [r["email"] for r in md(ev["email_format"])["failing_sample"]] == ["nope"]
    assert [r["order_id"] for r in md(ev["amount_cap"])["failing_sample"]] == ["12"]
    assert [r["customer_id"] for r in md(ev["customer_known"])["failing_sample"]] == ["99"]
    assert [r["order_id"] for r in md(ev["order_id_unique"])["failing_sample"]] == ["3"]
    assert sorted(r["order_id"] for r in md(ev["status_known"])["failing_sample"]) == ["8", "9"]
    assert md(ev["id_present"])["failing_sample"][0]["order_id"] == "None"
    # blocking: error rules are blocking checks; the failed ones name the run's outcome
    assert {n for n, e in ev.items() if not e.passed and e.severity.value == "ERROR"} == {
        "loaded_rows", "order_id_unique", "customer_known"}

    # main untouched, downstream not materialized, branch kept (with the rows, visible in the CLI)
    assert main_snapshot(platform, "bronze.orders") == s1
    assert "silver/orders" not in materialized(second)
    branch = "audit_" + second.run_id.replace("-", "_")
    assert len(rows_of(platform, "bronze.orders", branch)) == 11
    rc, out = cli("branches", "list")
    assert rc == 0 and branch in out and "bronze.orders__quarantine" in out
    # the schema contract (evolve) added the new column to the table
    assert "coupon" in [f.name for f in pyiceberg(platform).load_table("bronze.orders").schema().fields]

    # quarantined rows sit on the run's branch of the quarantine table, with every rule they failed
    q = rows_of(platform, "bronze.orders__quarantine", branch)
    got = sorted((r["order_id"] or 0, tuple(r["_failed_rules"])) for r in q)
    assert got == [(0, ("id_present",)), (8, ("status_known",)), (9, ("status_known", "amount_range"))]
    assert {r["_run_id"] for r in q} == {second.run_id}
    assert all(r["_quarantined_at"] is not None for r in q)

    # history: one row per evaluation, per run
    hist = check_history(platform.store, dataset="bronze.orders")
    assert len(hist) == 22
    latest = {h["rule"]: h for h in hist if h["run_id"] == second.run_id}
    assert latest["customer_known"]["passed"] is False and latest["customer_known"]["failed_rows"] == 1
    assert latest["customer_known"]["severity"] == "error" and latest["customer_known"]["total_rows"] == 6
    rc, out = cli("checks", "report")
    assert rc == 0
    line = next(ln for ln in out.splitlines() if " customer_known " in ln)
    assert "bronze.orders" in line and "50.0%" in line


def test_schema_contract_freeze_keeps_table_schema(platform, tmp_path):
    apply(platform, tmp_path, "- name: contract\n  type: schema_contract\n  schema_policy: freeze\n  severity: error\n"
          + textwrap.indent(EXPECTED.strip(), "  "))
    land(platform, "orders", "b1", [order(1), order(2)])
    assert run(platform).success
    land(platform, "orders", "b2", [order(3, coupon="X")])
    land(platform, "orders", "b3", [order(4)])
    res = run(platform)
    assert res.success
    ev = checks(res)["contract"]
    # each file is reconciled on its own: the one with a new column is quarantined, named in the check
    assert ev.passed and md(ev)["details"]["quarantined_files"] == [
        {"key": "b2.parquet", "reason": "new column coupon (string) (schema policy freeze)"}]
    assert "quarantined 1 file(s) that do not fit the table: b2.parquet" in md(ev)["message"]
    assert "coupon" not in [f.name for f in pyiceberg(platform).load_table("bronze.orders").schema().fields]
    assert sorted(r["order_id"] for r in rows_of(platform, "bronze.orders")) == [1, 2, 4]
