"""A stage's rules in as few Spark jobs as they allow (issue 21): when the audit's rows are the whole
branch (a write that replaced it), the `unique` rule's group-by also counts the row rules, the
non-nullable contract columns and the freshness maxima, instead of one pass for those and another
for the rule. Every number and message must be what the separate passes give; a rule failing at run
time must still fail only its own check. Real Spark."""

from __future__ import annotations

import datetime as dt
import re

from lakehouse.metadata.model import Rule
from lakehouse.validation.rules import evaluate_rules

NOW = dt.datetime(2026, 11, 27, 12, 0, 0)
ROWS = [  # event_id, user_id, event_type, event_ts, day
    ("e1", 5, "view", "2026-11-27 11:00:00", "d1"),
    ("e1", 6, "click", "2026-11-27 10:00:00", "d1"),  # e1 twice
    ("e2", 0, "view", "2026-11-26 10:00:00", "d2"),  # e2 three times, one user_id out of range
    ("e2", 7, "bogus", "2026-11-26 10:00:00", "d2"),
    ("e2", None, "view", None, None),
    ("e3", 8, "view", "2026-11-25 10:00:00", "d1"),
    (None, 9, "view", "2026-11-25 10:00:00", "d1"),  # NULL keys: never duplicates
    (None, 9, "BAD", "2026-11-25 10:00:00", "d1"),
]
SCHEMA = "event_id string, user_id bigint, event_type string, event_ts string, day string"


def _rules(*extra: dict) -> list[Rule]:
    base = [
        {"name": "event_id_unique", "type": "unique", "columns": ["event_id"]},
        {"name": "pair_unique", "type": "unique", "columns": ["event_id", "day"], "severity": "warn"},
        {"name": "known_type", "type": "accepted_values", "column": "event_type",
         "values": ["view", "click"], "severity": "warn"},
        {"name": "user_positive", "type": "range", "column": "user_id", "min": 1, "severity": "warn"},
        {"name": "has_rows", "type": "row_count", "min": 1},
        {"name": "fresh", "type": "freshness", "column": "event_ts", "max_age_seconds": 1800},
        {"name": "contract", "type": "schema_contract", "schema_policy": "evolve",
         "expected_columns": [{"name": "event_id", "type": "string"},
                              {"name": "user_id", "type": "bigint", "nullable": False}]},
    ]
    return [Rule(**r) for r in base + list(extra)]


def _view(outcomes) -> dict:
    """Everything an outcome reports (py4j's object ids in an error's text aside)."""
    def plain(text):
        return re.sub(r"\bo\d+\.", "o.", str(text))

    return {o.rule.name: (o.passed, o.failed_rows, o.total_rows, plain(o.message), o.expression,
                          {k: plain(v) for k, v in o.details.items()},
                          sorted(map(repr, o.sample))) for o in outcomes}


def _jobs(spark, group: str, fn):
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        out = fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    return out, len(sc.statusTracker().getJobIdsForGroup(group))


def _run(spark, rows, rules, shared: bool, tag: str):
    df = spark.createDataFrame(rows, SCHEMA)
    table = df if shared else spark.createDataFrame(rows, SCHEMA)  # equal rows, another frame: separate passes
    return _jobs(spark, f"one_pass_{tag}_{shared}",
                 lambda: evaluate_rules(df, rules, context={"table": table, "now": NOW}))


def test_one_pass_gives_every_number_and_message_of_the_separate_passes(spark):
    rules = _rules()
    shared, shared_jobs = _run(spark, ROWS, rules, True, "all")
    apart, apart_jobs = _run(spark, ROWS, rules, False, "all")
    assert _view(shared) == _view(apart)
    got = {o.rule.name: o for o in shared}
    assert (got["event_id_unique"].failed_rows, got["event_id_unique"].message) == (5, "5 rows share 2 duplicated key(s)")
    assert got["event_id_unique"].details == {"duplicate_keys": 2}
    assert sorted((r["event_id"], r["rows"]) for r in got["event_id_unique"].sample) == [("e1", 2), ("e2", 3)]
    assert (got["pair_unique"].failed_rows, got["pair_unique"].details) == (4, {"duplicate_keys": 2})
    assert (got["known_type"].failed_rows, got["known_type"].total_rows) == (2, 8)
    assert got["user_positive"].failed_rows == 2  # 0 and NULL
    assert got["contract"].message == "1 NULL(s) in non-nullable column user_id"
    assert got["fresh"].passed is False and got["fresh"].details["newest"] == "2026-11-27 11:00:00"
    # the row keys ride on the first unique rule's group-by: the samples of the failing rules and the
    # second unique rule's pass remain; the row keys' own pass (and its jobs) is gone
    assert shared_jobs < apart_jobs, (shared_jobs, apart_jobs)


def test_one_pass_on_a_passing_stage_is_one_aggregation(spark):
    rows = [r for r in ROWS if r[0] in ("e3",)] + [("e4", 3, "click", "2026-11-27 11:59:00", "d1")]
    rules = [r for r in _rules() if r.name in ("event_id_unique", "known_type", "user_positive", "has_rows")]
    shared, shared_jobs = _run(spark, rows, rules, True, "pass")
    apart, apart_jobs = _run(spark, rows, rules, False, "pass")
    assert _view(shared) == _view(apart)
    assert all(o.passed for o in shared)
    assert shared_jobs < apart_jobs, (shared_jobs, apart_jobs)


def test_no_rows(spark):
    shared, _ = _run(spark, [], _rules(), True, "empty")
    apart, _ = _run(spark, [], _rules(), False, "empty")
    assert _view(shared) == _view(apart)
    got = {o.rule.name: o for o in shared}
    assert (got["has_rows"].passed, got["has_rows"].total_rows) == (False, 0)
    assert got["event_id_unique"].passed and got["event_id_unique"].message == "all keys unique"


def test_a_rule_failing_at_run_time_still_fails_only_its_own_check(spark):
    rules = _rules(Rule(name="boom", type="expression", expression="raise_error('boom') IS NULL",
                        severity="warn").model_dump())
    shared, _ = _run(spark, ROWS, rules, True, "boom")
    apart, _ = _run(spark, ROWS, rules, False, "boom")
    assert _view(shared) == _view(apart)
    got = {o.rule.name: o for o in shared}
    assert not got["boom"].passed and "could not be evaluated" in got["boom"].message
    assert got["event_id_unique"].failed_rows == 5 and got["known_type"].failed_rows == 2
