"""Row rules answered from Iceberg file statistics: every key the statistics answer equals what
the rows say, a key they cannot decide is left to the rows, and the audit path uses them instead
of evaluating those rules on every row while writing. Real Spark writing real Iceberg files."""

from __future__ import annotations

import datetime as dt
import math
import textwrap

import pytest

from lakehouse.engines.types import arrow_schema
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import Rule
from lakehouse.validation.file_metrics import FileMetrics, answerable_keys
from lakehouse.validation.rules import RowPass, evaluate_rules

SCHEMA = ("id bigint, code string, qty int, price double, amount decimal(10,2), ts timestamp, day date, "
          "label string")
T0 = dt.datetime(2026, 11, 1, 12, 0, 0, tzinfo=dt.UTC)
LATER = (T0 + dt.timedelta(days=10)).replace(tzinfo=None)  # "now" of the audits: naive UTC


def rule(**kw) -> Rule:
    return Rule(severity="warn", **kw)


def rows_batch_1():
    from decimal import Decimal

    return [(1, "a", 5, 1.5, Decimal("10.00"), T0, T0.date(), "x"),
            (2, None, 7, 2.5, Decimal("20.00"), T0 + dt.timedelta(hours=1), T0.date(), None),
            (3, "c", None, 3.5, Decimal("30.00"), None, None, "z")]


def rows_batch_2():
    from decimal import Decimal

    return [(4, "d", 9, float("nan"), Decimal("40.00"), T0 + dt.timedelta(hours=5),
             (T0 + dt.timedelta(days=2)).date(), "w"),
            (None, "e", 11, -1.0, Decimal("50.00"), T0 - dt.timedelta(days=3), None, "v")]


RULES = [
    rule(name="id_present", type="not_null", columns=["id"]),                 # one NULL id: exact from counts
    rule(name="code_and_label", type="not_null", columns=["code", "label"]),  # NULLs in both: needs rows
    rule(name="qty_and_id", type="not_null", columns=["qty", "ID"]),           # NULLs in both (case-insensitive)
    rule(name="qty_range", type="range", column="qty", min=0, max=100),       # inside: the NULLs fail
    rule(name="qty_tight", type="range", column="qty", max=8),                # outside: needs rows
    rule(name="price_range", type="range", column="price", min=-10, max=10),  # a NaN: needs rows
    rule(name="amount_range", type="range", column="amount", min=0, max=50),  # decimal, inside
    rule(name="ts_after", type="range", column="ts", min="2026-01-01"),        # string bound: never statistics
    rule(name="code_known", type="accepted_values", column="code", values=["a", "c", "d", "e"]),
    rule(name="fresh_ts", type="freshness", column="ts", max_age_seconds=10**9),
    rule(name="fresh_day", type="freshness", column="day", max_age_seconds=10**9),
    rule(name="fresh_label", type="freshness", column="label", max_age_seconds=10**9),
]


def new_table(platform, ns: str, name: str, columns: str = SCHEMA, properties: str = ""):
    """(spark, tables, identifier) of a new empty Iceberg table in the test's catalog."""
    tables = platform.tables()
    ident = f"{ns}.{name}"
    tables.ensure_namespace(ns)
    platform.spark().sql(f"CREATE TABLE {tables.qualified(ident)} ({columns}) USING iceberg {properties}")
    return platform.spark(), tables, ident


@pytest.fixture
def branch_table(platform, unique_ns):
    """A table with one row on main and two appends on an audit branch (the run's new rows)."""
    spark, tables, ident = new_table(platform, unique_ns, "facts")
    from decimal import Decimal

    old = [(0, None, -50, 99.0, Decimal("99.00"), T0 + dt.timedelta(days=30), None, None)]  # main: not ours
    spark.createDataFrame(old, SCHEMA).writeTo(tables.qualified(ident)).append()
    tables.create_branch(ident, "audit_x")
    fork = tables.snapshot_id(ident, "audit_x")
    for batch in (rows_batch_1(), rows_batch_2()):
        spark.createDataFrame(batch, SCHEMA).writeTo(tables.qualified(ident, "audit_x")).append()
    head = tables.snapshot_id(ident, "audit_x")
    new_rows = (spark.read.format("iceberg").option("start-snapshot-id", str(fork))
                .option("end-snapshot-id", str(head)).load(tables.qualified(ident)))
    return tables, ident, fork, head, new_rows


def test_statistics_answer_exactly_what_the_rows_say(branch_table):
    tables, ident, fork, head, new_rows = branch_table
    schema, files = tables.data_files(ident, head, since=fork)
    assert sum(f.record_count for f in files) == 5  # the branch's two appends, not main's row
    metrics = FileMetrics.from_data_files(schema, files)
    rp = RowPass.plan(new_rows, RULES)
    answered = metrics.answer(rp)
    from_rows = new_rows.agg(*rp.aggregates()).collect()[0].asDict()

    assert set(answered) == {"total", "f:id_present", "f:qty_range", "f:amount_range", "m:ts", "m:day"}
    for key, value in answered.items():
        assert value == pytest.approx(from_rows[key]), key
    assert answered["total"] == 5 and answered["f:id_present"] == 1 and answered["f:qty_range"] == 1
    assert answered["m:ts"] == pytest.approx((T0 + dt.timedelta(hours=5)).replace(tzinfo=dt.UTC).timestamp())
    # what the frame's schema says statistics could answer (when the data passes), before any file exists
    assert answerable_keys(rp, arrow_schema(new_rows.schema)) == {
        "total", "f:id_present", "f:code_and_label", "f:qty_and_id", "f:qty_range", "f:qty_tight",
        "f:price_range", "f:amount_range", "m:ts", "m:day"}
    # the undecided keys are exactly the ones the rows decide differently from a naive reading
    assert from_rows["f:code_and_label"] == 1  # one row with both NULL: counts alone would say 1 or 2
    assert from_rows["f:qty_tight"] == 3
    assert from_rows["f:price_range"] == 1 and from_rows["f:qty_and_id"] == 2


def test_outcomes_are_the_same_with_and_without_statistics(branch_table):
    tables, ident, fork, head, new_rows = branch_table
    metrics = FileMetrics.from_data_files(*tables.data_files(ident, head, since=fork))
    with_stats = evaluate_rules(new_rows, RULES, context={"file_metrics": metrics, "now": LATER})
    from_rows = evaluate_rules(new_rows, RULES, context={"now": LATER})
    assert [(o.rule.name, o.passed, o.failed_rows, o.total_rows, o.message) for o in with_stats] == \
           [(o.rule.name, o.passed, o.failed_rows, o.total_rows, o.message) for o in from_rows]
    source = {o.rule.name: o.details.get("counted_from") for o in with_stats}
    assert source["id_present"] == source["qty_range"] == source["fresh_ts"] == "iceberg_file_statistics"
    assert source["qty_tight"] == source["code_known"] == source["fresh_label"] == "rows"
    assert {o.details.get("counted_from") for o in from_rows if o.rule.is_row_rule} == {"rows"}


def test_missing_statistics_leave_every_rule_to_the_rows(platform, unique_ns):
    spark, tables, ident = new_table(platform, unique_ns, "nometrics",
                                     properties="TBLPROPERTIES ('write.metadata.metrics.default'='none')")
    spark.createDataFrame(rows_batch_1() + rows_batch_2(), SCHEMA).writeTo(tables.qualified(ident)).append()
    head = tables.snapshot_id(ident)
    metrics = FileMetrics.from_data_files(*tables.data_files(ident, head))
    df = tables.read(ident)
    assert metrics.answer(RowPass.plan(df, RULES)) == {"total": 5}
    got = evaluate_rules(df, RULES, context={"file_metrics": metrics, "now": LATER})
    want = evaluate_rules(df, RULES, context={"now": LATER})
    assert [(o.passed, o.failed_rows, o.total_rows) for o in got] == [(o.passed, o.failed_rows, o.total_rows)
                                                                       for o in want]


def test_delete_files_make_statistics_unusable(platform, unique_ns):
    """A merge-on-read delete hides rows the data files' statistics still count."""
    spark, tables, ident = new_table(platform, unique_ns, "mor", properties="TBLPROPERTIES "
                                     "('format-version'='2', 'write.delete.mode'='merge-on-read')")
    spark.createDataFrame(rows_batch_1(), SCHEMA).writeTo(tables.qualified(ident)).append()
    before = tables.snapshot_id(ident)
    assert sum(f.record_count for f in tables.data_files(ident, before)[1]) == 3
    spark.sql(f"DELETE FROM {tables.qualified(ident)} WHERE id = 2")
    after = tables.snapshot_id(ident)
    assert tables.data_files(ident, after) is None
    assert tables.data_files(ident, after, since=before) is None  # the run's own snapshot deleted rows
    assert tables.data_files(ident, before, since=after) is None  # not an ancestor


AUDIT_META = """
pipelines:
  - {pipeline_id: stats}
targets:
  - {target_id: stats_target, namespace: %(ns)s, table: events, write_mode: append}
stages:
  - {pipeline_id: stats, stage_order: 1, stage_name: load, layer: silver, target_id: stats_target,
     # the rows come from the test's batches; the SQL only declares the columns the rules check
     transformation: "SELECT 'e' AS event_id, 1.0D AS amount, 'a' AS kind, current_timestamp() AS event_ts",
     validation_set_id: stats_rules}
validation_rules:
  - rule_set_id: stats_rules
    rules:
%(rules)s
"""


def _apply(platform, tmp_path, ns: str, rules: str) -> None:
    path = tmp_path / "meta.yaml"
    path.write_text(AUDIT_META % {"ns": ns, "rules": textwrap.indent(textwrap.dedent(rules).strip(), " " * 6)})
    platform.store.apply(load_metadata(path))


def _events(spark, rows):
    return spark.createDataFrame(rows, "event_id string, amount double, kind string, event_ts timestamp")


@pytest.mark.parametrize("observed", [False, True], ids=["statistics_only", "with_observed_rule"])
def test_audit_path_answers_from_statistics_and_observes_only_the_rest(platform, tmp_path, unique_ns, observed):
    from lakehouse.engines.spark import write as wap
    from lakehouse.stage.runner import Batch, StageRunner

    rules = """
    - {name: not_empty, type: row_count, min: 1, severity: error}
    - {name: id_present, type: not_null, columns: [event_id], severity: warn}
    - {name: amount_range, type: range, column: amount, min: 0, max: 100, severity: warn}
    - {name: fresh, type: freshness, column: event_ts, max_age_seconds: 3600, severity: warn}
    """ + ("- {name: kind_known, type: accepted_values, column: kind, values: [a, b], severity: warn}"
           if observed else "")
    _apply(platform, tmp_path, unique_ns, rules)
    spark = platform.spark()
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    batches = [
        [("e1", 10.0, "a", now), ("e2", 20.0, "b", now - dt.timedelta(minutes=5))],
        [(None, 30.0, "c", now - dt.timedelta(minutes=1)), ("e4", 500.0, "a", now), ("e5", None, "b", now)],
    ]
    observations = []
    real_observe = wap.SparkAuditedWrite._observed_keys

    def spy(self, row_pass, keep):
        keys = real_observe(self, row_pass, keep)
        observations.append(keys)
        return keys

    wap.SparkAuditedWrite._observed_keys = spy
    try:
        out = StageRunner(platform, "stats", "load", run_id=f"stats_{unique_ns}").wap().run(
            [Batch(_events(spark, rows), label=f"b{i}") for i, rows in enumerate(batches)])
    finally:
        wap.SparkAuditedWrite._observed_keys = real_observe
    assert out.published and out.rows_written == 5
    # what was counted on the rows while writing: only the rule the statistics cannot answer
    assert observations == ([{"f:kind_known"}] * 2 if observed else [set(), set()])
    got = {c.rule.name: c for c in out.checks}
    assert (got["not_empty"].passed, got["not_empty"].total_rows) == (True, 5)
    assert (got["id_present"].failed_rows, got["id_present"].details["counted_from"]) == \
           (1, "iceberg_file_statistics")
    # bounds outside the range: the exact count (500.0 and the NULL) comes from the rows
    assert (got["amount_range"].failed_rows, got["amount_range"].details["counted_from"]) == (2, "rows")
    assert sorted(str(r["amount"]) for r in got["amount_range"].sample) == ["500.0", "None"]
    assert got["fresh"].passed and got["fresh"].details["counted_from"] == "iceberg_file_statistics"
    assert got["fresh"].details["newest"] == str(now.replace(tzinfo=None))
    if observed:
        assert (got["kind_known"].failed_rows, got["kind_known"].details["counted_from"]) == \
               (1, "observed_on_write")


def test_infinity_is_a_bound_like_any_other(platform, unique_ns):
    """(NaN, which Iceberg keeps out of the bounds, is covered by `price_range` above.)"""
    spark, tables, ident = new_table(platform, unique_ns, "floats", "x double")
    spark.createDataFrame([(1.0,), (math.inf,)], "x double").writeTo(tables.qualified(ident)).append()
    df = tables.read(ident)
    metrics = FileMetrics.from_data_files(*tables.data_files(ident, tables.snapshot_id(ident)))
    open_top = rule(name="open_top", type="range", column="x", min=0)
    capped = rule(name="capped", type="range", column="x", max=10)
    answered = metrics.answer(RowPass.plan(df, [open_top, capped]))
    assert answered == {"total": 2, "f:open_top": 0}  # inf is within [0, +inf); above 10: the rows count
    assert evaluate_rules(df, [capped], context={"file_metrics": metrics})[0].failed_rows == 1


def test_unreadable_statistics_fall_back_to_the_rows(platform, tmp_path, unique_ns, monkeypatch, caplog):
    """Manifests that cannot be read (storage credentials, a corrupt file) cost speed, not answers."""
    from lakehouse.stage.runner import Batch, StageRunner
    from lakehouse.table.iceberg import IcebergTables

    _apply(platform, tmp_path, unique_ns, """
    - {name: not_empty, type: row_count, min: 1, severity: error}
    - {name: id_present, type: not_null, columns: [event_id], severity: warn}
    - {name: amount_range, type: range, column: amount, min: 0, max: 100, severity: warn}
    """)

    def unreadable(self, *a, **kw):
        raise OSError("manifest-list s3://bucket/metadata/snap-1.avro: access denied")

    monkeypatch.setattr(IcebergTables, "data_files", unreadable)
    now = dt.datetime.now(dt.UTC)
    rows = [("e1", 10.0, "a", now), (None, 500.0, "b", now), ("e3", None, "a", now)]
    with caplog.at_level("WARNING", logger="lakehouse.engines.spark.write"):
        out = StageRunner(platform, "stats", "load", run_id=f"nostats_{unique_ns}").wap().run(
            [Batch(_events(platform.spark(), rows), label="b")])
    got = {c.rule.name: (c.passed, c.failed_rows, c.total_rows, c.details["counted_from"]) for c in out.checks}
    assert got == {"not_empty": (True, 0, 3, "rows"), "id_present": (False, 1, 3, "rows"),
                   "amount_range": (False, 2, 3, "rows")}
    assert "file statistics unreadable (manifest-list s3://bucket/metadata/snap-1.avro: access denied)" in caplog.text
