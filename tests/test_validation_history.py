"""Check history API (the dashboard's contract): check_history and pass_rates on a real control DB."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lakehouse.metadata.model import Rule
from lakehouse.metadata.store import MetadataStore
from lakehouse.validation.history import check_history, pass_rates, record_results
from lakehouse.validation.rules import CheckOutcome


@pytest.fixture
def store(tmp_path):
    s = MetadataStore(f"sqlite:///{tmp_path / 'control.db'}")
    s.create_all()
    return s


def _o(name: str, passed: bool, failed: int = 0, total: int = 10, severity: str = "error") -> CheckOutcome:
    rule = Rule(name=name, type="not_null", columns=["a"], severity=severity)
    return CheckOutcome(rule, passed, failed, total, "`a` IS NOT NULL", message="m")


def test_history_and_pass_rates(store):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(5):
        record_results(store, [_o("a_present", i % 2 == 0, 0 if i % 2 == 0 else 3), _o("b_ok", True, severity="warn")],
                       run_id=f"run{i}", dataset="bronze.x", ts=t0 + timedelta(minutes=i))
    record_results(store, [_o("a_present", False, 7)], run_id="other", dataset="silver.y", ts=t0)

    hist = check_history(store, dataset="bronze.x", rule="a_present")
    assert [h["run_id"] for h in hist] == ["run4", "run3", "run2", "run1", "run0"]  # newest first
    assert hist[1]["passed"] is False and hist[1]["failed_rows"] == 3 and hist[1]["total_rows"] == 10
    assert hist[0]["severity"] == "error" and hist[0]["ts"] == t0 + timedelta(minutes=4)
    assert hist[0]["details"]["expression"] == "`a` IS NOT NULL"
    assert len(check_history(store)) == 11
    assert len(check_history(store, limit=2)) == 2
    assert check_history(store, dataset="nope") == []

    rates = {(r["dataset"], r["rule"]): r for r in pass_rates(store)}
    assert rates[("bronze.x", "a_present")]["evaluations"] == 5
    assert rates[("bronze.x", "a_present")]["pass_rate"] == pytest.approx(3 / 5)
    assert rates[("bronze.x", "a_present")]["last_passed"] is True
    assert rates[("bronze.x", "b_ok")]["pass_rate"] == 1.0
    assert rates[("silver.y", "a_present")]["pass_rate"] == 0.0
    # last_n windows per rule: the last two a_present runs are run4 (pass) and run3 (fail)
    last2 = {(r["dataset"], r["rule"]): r for r in pass_rates(store, last_n=2)}
    assert last2[("bronze.x", "a_present")]["evaluations"] == 2
    assert last2[("bronze.x", "a_present")]["pass_rate"] == 0.5
    with pytest.raises(ValueError, match="last_n"):
        pass_rates(store, last_n=0)
