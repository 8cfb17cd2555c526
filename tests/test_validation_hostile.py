"""Hostile rules and identifiers: nothing in a rule can inject SQL. A statement, a subquery, an
aggregate, a non-boolean or a parenthesis escape in an `expression` rule, and quotes in values,
either evaluate literally or fail the check with a clear reason; backticks or quotes in a rule's
column names are refused when the metadata is loaded; no other table is touched."""

from __future__ import annotations

import textwrap

import pyarrow as pa
import yaml

from lakehouse.metadata.model import Rule
from lakehouse.validation.rules import RuleError, check_expression
from tests.test_wap_helpers import (
    ORDER_SCHEMA,
    apply,
    land,
    land_customers,
    materialized,
    order,
    pyiceberg,
    rows_of,
    run,
)

WEIRD = "we`ird 'col\""

RULES = f"""
- {{name: weird_present, type: not_null, columns: ['{WEIRD.replace("'", "''")}'], severity: warn}}
- {{name: inject_statement, type: expression, expression: "true; DROP TABLE bronze.customers", severity: warn}}
- {{name: inject_subquery, type: expression, expression: "customer_id IN (SELECT customer_id FROM bronze.customers)",
   severity: warn}}
- {{name: not_boolean, type: expression, expression: "amount + 1", severity: warn}}
- {{name: aggregate, type: expression, expression: "sum(amount) > 0", severity: warn}}
- {{name: paren_escape, type: expression, expression: "true) OR (true", severity: warn}}
- {{name: hostile_column, type: not_null, columns: ["order_id` IS NOT NULL OR `status"], severity: warn}}
- {{name: hostile_value, type: accepted_values, column: status, values: ["paid') OR ('1'='1"], severity: warn}}
- {{name: hostile_regex_value, type: regex, column: email, pattern: "x' OR '1'='1", severity: warn}}
- {{name: fine_expression, type: expression, expression: "amount >= 0 AND status <> 'x'", severity: error}}
"""


def test_hostile_rules_and_identifiers_do_not_inject(platform, tmp_path):
    import pytest

    from lakehouse.metadata.loader import MetadataError
    from lakehouse.metadata.model import ValidationRuleSet
    from lakehouse.stage.runner import StageRunner

    # `metadata apply` refuses column names that would leave their quotes, naming each entry (the
    # model's check: a stored row is checked again on load, so plain SQL cannot slip one past it)...
    with pytest.raises(MetadataError) as exc:
        apply(platform, tmp_path, RULES)
    assert len(exc.value.problems) == 2, exc.value.problems
    for entry in ("validation_rules[0].rules[0].columns", "validation_rules[0].rules[6].columns"):
        assert any(entry in p and "is not a column name the platform accepts" in p for p in exc.value.problems)
    # ...and the rules that are not one boolean expression, before anything runs
    rules = [r for r in yaml.safe_load(textwrap.dedent(RULES)) if r["name"] not in ("weird_present", "hostile_column")]
    with pytest.raises(MetadataError) as exc:
        apply(platform, tmp_path, yaml.safe_dump(rules, sort_keys=False))
    refused = {p.split("rule '")[1].split("'")[0] for p in exc.value.problems}
    assert refused == {"inject_statement", "inject_subquery", "aggregate", "paren_escape"}, exc.value.problems
    assert platform.store.load().pipelines == []
    # defence in depth: an operator puts them in the control DB with plain SQL, past validation
    apply(platform, tmp_path, "- {name: placeholder, type: row_count, min: 0}")
    platform.store.upsert([ValidationRuleSet(rule_set_id="order_rules", rules=rules)])
    land_customers(platform, ids=(1, 2))
    assert run(platform, "customers_etl").success
    schema = ORDER_SCHEMA.append(pa.field(WEIRD, pa.string()))
    land(platform, "orders", "b1", [{**order(1), WEIRD: "x"}, {**order(2), WEIRD: None}, {**order(3), WEIRD: "y"}],
         schema)
    # a Dagster run checks its stages first and stops before writing anything (lakehouse.runtime.preflight)
    res = run(platform)
    assert not res.success and not materialized(res)
    assert not pyiceberg(platform).table_exists("bronze.orders")
    # the stage run directly (no pre-run check) evaluates them: each fails with a reason, none injects
    runner = StageRunner(platform, "orders_etl", "ingest")
    outcome = runner.load(runner.extract())
    assert outcome.published  # every hostile rule is warn-only; the one error rule is fine and passes
    ev = {o.rule.name: o for o in outcome.checks}

    # (a column whose name has backticks and quotes is just a column of the data; a rule naming it is
    # refused above, and its predicate quotes it all the same: tests/test_engine_parity.py)
    # values and patterns are literals: they match nothing, so every row fails
    assert (ev["hostile_value"].passed, ev["hostile_value"].failed_rows) == (False, 3)
    assert (ev["hostile_regex_value"].passed, ev["hostile_regex_value"].failed_rows) == (False, 3)
    reasons = {
        "inject_statement": "must be one expression",
        "inject_subquery": "not a statement or subquery",
        "not_boolean": "not boolean",
        "aggregate": "no aggregates",
        "paren_escape": "does not parse",
    }
    for name, reason in reasons.items():
        assert ev[name].passed is False, name
        assert reason in ev[name].message, (name, ev[name].message)
        assert name in ev[name].message
    assert ev["fine_expression"].passed is True

    # nothing else was touched
    assert sorted(r["customer_id"] for r in rows_of(platform, "bronze.customers")) == [1, 2]
    assert sorted(r["order_id"] for r in rows_of(platform, "bronze.orders")) == [1, 2, 3]


def test_check_expression_rejects_what_is_not_one_boolean_expression():
    ok = ["amount > 0", "status IN ('a', 'b') AND coalesce(x, 0) < 5", "`we``ird` IS NULL"]
    for e in ok:
        assert check_expression(e) == e
    bad = ["SELECT 1", "1; SELECT 2", "x IN (SELECT y FROM t)", "max(x) > 1", "row_number() OVER (ORDER BY x) = 1",
           "DROP TABLE t", "a) OR (b", ""]
    for e in bad:
        try:
            check_expression(e, "r")
        except RuleError as exc:
            assert "rule 'r'" in str(exc)
        else:  # pragma: no cover - a failure message
            raise AssertionError(f"accepted {e!r}")
    assert Rule(name="r", type="expression", expression="a > 1").is_row_rule
