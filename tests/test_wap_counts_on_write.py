"""Rule counts taken on the writes themselves (issue 21: the demo on Spark without extra passes):
the quarantine rules' counts ride on the quarantine write and the kept rows' commit, and a stage
that replaces its whole table has its row rules observed on that write. Each count must equal a
recount of the same rows, and a failing blocking rule must still keep `main` untouched. Real
Spark writing real Iceberg tables."""

from __future__ import annotations

import textwrap

import pytest

from lakehouse.metadata.loader import load_metadata

META = """
pipelines:
  - {pipeline_id: counts}
targets:
  - {target_id: counts_target, namespace: %(ns)s, table: events, write_mode: %(mode)s%(order)s}
stages:
  - {pipeline_id: counts, stage_order: 1, stage_name: load, layer: silver, target_id: counts_target,
     # the rows come from the test's batches; the SQL only declares the columns the rules check
     transformation: "SELECT 'e' AS event_id, 1.0D AS amount, 'a' AS kind",
     validation_set_id: counts_rules}
validation_rules:
  - rule_set_id: counts_rules
    rules:
%(rules)s
"""

QUARANTINE_RULES = """
- {name: not_empty, type: row_count, min: 1, severity: error}
- {name: id_present, type: not_null, columns: [event_id], severity: warn, action: quarantine}
- {name: kind_known, type: accepted_values, column: kind, values: [a, b], severity: warn, action: quarantine}
- {name: amount_range, type: range, column: amount, min: 0, max: 100, severity: warn}
"""
DROP_RULE = "- {name: amount_present, type: not_null, columns: [amount], severity: warn, action: drop}\n"

# two batches; rows failing one quarantine rule, both, none, and (for the drop variant) a NULL amount
BATCHES = [
    [("e1", 10.0, "a"), (None, 20.0, "b"), ("e3", 30.0, "zz"), (None, 40.0, "zz"), ("e5", None, "a")],
    [("e6", 500.0, "b"), (None, 1.0, "a"), ("e8", 2.0, "q"), ("e9", 3.0, "b")],
]


def _apply(platform, tmp_path, ns: str, rules: str, mode: str, ordered: bool = False) -> None:
    path = tmp_path / "meta.yaml"
    path.write_text(META % {"ns": ns, "mode": mode, "order": ", sort_order: [{column: kind}]" if ordered else "",
                            "rules": textwrap.indent(textwrap.dedent(rules).strip(), " " * 6)})
    platform.store.apply(load_metadata(path))


def _frame(spark, rows):
    return spark.createDataFrame(rows, "event_id string, amount double, kind string")


@pytest.mark.parametrize("drop", [False, True], ids=["quarantine_only", "with_drop_rule"])
def test_quarantine_counts_ride_on_the_writes_and_equal_a_recount(platform, tmp_path, unique_ns, drop):
    """With quarantine rules only, no pass of its own counts them (ActionCounts.add is not called):
    the quarantine write observes them and the kept rows' commit gives the rest of the total. A
    drop rule (its rows are in neither write) keeps the counting pass. Both give the recount."""
    from pyspark.sql import functions as F

    from lakehouse.stage.runner import Batch, StageRunner
    from lakehouse.validation import rules as rules_mod
    from lakehouse.validation.quarantine import quarantine_identifier

    rules = QUARANTINE_RULES + (DROP_RULE if drop else "")
    _apply(platform, tmp_path, unique_ns, rules, "append")
    spark = platform.spark()
    counted = []
    real_add = rules_mod.ActionCounts.add

    def spy(self, tagged, rule_list):
        counted.append(1)
        return real_add(self, tagged, rule_list)

    rules_mod.ActionCounts.add = spy
    try:
        runner = StageRunner(platform, "counts", "load", run_id=f"counts_{unique_ns}")
        out = runner.wap().run([Batch(_frame(spark, rows), label=f"b{i}") for i, rows in enumerate(BATCHES)])
    finally:
        rules_mod.ActionCounts.add = real_add
    assert counted == ([1, 1] if drop else [])

    # the recount: every input row tagged once, counted per rule
    acting = [r for r in runner.rules if r.enabled]
    tagged = rules_mod.tag_failures(_frame(spark, BATCHES[0] + BATCHES[1]), acting)
    recount = {name: tagged.where(F.array_contains(F.col(rules_mod.FAILED_RULES_COLUMN), name)).count()
               for name in ("id_present", "kind_known", "amount_present")}
    assert recount["id_present"] == 3 and recount["kind_known"] == 3  # one row fails both
    got = {c.rule.name: c for c in out.checks}
    total = len(BATCHES[0]) + len(BATCHES[1])
    for name in ("id_present", "kind_known") + (("amount_present",) if drop else ()):
        c = got[name]
        assert (c.failed_rows, c.total_rows, c.passed) == (recount[name], total, False), name
        assert c.sample and all(name != "id_present" or s["event_id"] is None for s in c.sample)
    # rows failing either quarantine rule, quarantined once each; the rest (less the dropped) in the table
    quarantined = 5
    assert out.quarantined_rows == quarantined
    tables = platform.tables()
    q = tables.read(quarantine_identifier(runner.target.identifier)).where(F.col("_run_id") == runner.run_id)
    assert q.count() == quarantined
    dropped = 1 if drop else 0  # ("e5", None, "a"): passes both quarantine rules, fails the drop rule
    assert out.rows_written == tables.read(runner.target.identifier).count() == total - quarantined - dropped


def test_a_whole_table_overwrite_observes_its_row_rules_on_the_write(platform, tmp_path, unique_ns):
    """An overwrite target: every batch replaces the table, so the last batch's observed counts are
    the audit's counts (those of earlier batches are gone with their rows); no pass after the write."""
    from lakehouse.stage.runner import Batch, StageRunner

    _apply(platform, tmp_path, unique_ns, """
    - {name: has_rows, type: row_count, min: 1, severity: error}
    - {name: amount_range, type: range, column: amount, min: 0, max: 100, severity: warn}
    - {name: kind_known, type: accepted_values, column: kind, values: [a, b], severity: warn}
    """, "overwrite")
    spark = platform.spark()
    first = [("e1", 500.0, "zz"), ("e2", 600.0, "zz"), ("e3", 1.0, "a")]
    last = [("e4", 700.0, "a"), ("e5", 2.0, "q"), ("e6", 3.0, "b"), ("e7", None, "b")]
    runner = StageRunner(platform, "counts", "load", run_id=f"overwrite_{unique_ns}")
    out = runner.wap().run([Batch(_frame(spark, rows), label=f"b{i}") for i, rows in enumerate((first, last))])
    assert out.published
    got = {c.rule.name: (c.failed_rows, c.total_rows, c.details["counted_from"]) for c in out.checks}
    # the recount over what main holds now: the last batch's rows only
    table = platform.tables().read(runner.target.identifier)
    assert table.count() == 4
    assert table.where("NOT coalesce(amount BETWEEN 0 AND 100, false)").count() == 2
    # a range is left to the file statistics while writing; bounds outside it: the rows count it
    assert got["amount_range"][:2] == (2, 4)  # 700.0 and the NULL
    assert got["kind_known"] == (1, 4, "observed_on_write")
    assert got["has_rows"][1] == 4


def test_a_failing_blocking_rule_observed_on_an_overwrite_still_blocks_publish(platform, tmp_path, unique_ns):
    from lakehouse.stage.core import AuditFailed
    from lakehouse.stage.runner import Batch, StageRunner

    _apply(platform, tmp_path, unique_ns, """
    - {name: kind_known, type: accepted_values, column: kind, values: [a, b], severity: error}
    """, "overwrite")
    spark = platform.spark()
    tables = platform.tables()
    good = StageRunner(platform, "counts", "load", run_id=f"good_{unique_ns}").wap().run(
        [Batch(_frame(spark, [("e1", 1.0, "a")]), label="good")])
    assert good.published
    ident = good.target.identifier
    before = tables.snapshot_id(ident)
    with pytest.raises(AuditFailed) as err:
        StageRunner(platform, "counts", "load", run_id=f"bad_{unique_ns}").wap().run(
            [Batch(_frame(spark, [("e2", 1.0, "a"), ("e3", 2.0, "zz"), ("e4", 3.0, None)]), label="bad")])
    check = next(c for c in err.value.outcomes if c.rule.name == "kind_known")
    assert (check.failed_rows, check.total_rows, check.details["counted_from"]) == (2, 3, "observed_on_write")
    assert tables.snapshot_id(ident) == before  # main untouched
    assert [r["event_id"] for r in tables.read(ident).collect()] == ["e1"]


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_table_with_a_write_order_counts_each_failing_row_once(platform, tmp_path, unique_ns, mode):
    """A write order makes Iceberg ask Spark for a range distribution, whose sampling job runs the
    plan a second time: counts observed on such a write came out doubled (the demo's silver stage
    reported 6 failing rows for 3). Such a write is not observed; the audit counts on the branch."""
    from lakehouse.stage.core import AuditFailed
    from lakehouse.stage.runner import Batch, StageRunner

    _apply(platform, tmp_path, unique_ns, """
    - {name: kind_known, type: accepted_values, column: kind, values: [a, b], severity: error}
    """, mode, ordered=True)
    spark = platform.spark()
    rows = [("e1", 1.0, "a"), ("e2", 2.0, "zz"), ("e3", 3.0, "q"), ("e4", 4.0, "zz"), ("e5", 5.0, "b")]
    with pytest.raises(AuditFailed) as err:
        StageRunner(platform, "counts", "load", run_id=f"ordered_{unique_ns}").wap().run(
            [Batch(_frame(spark, rows), label="ordered")])
    check = next(c for c in err.value.outcomes if c.rule.name == "kind_known")
    assert (check.failed_rows, check.total_rows) == (3, 5)
    assert check.details["counted_from"] != "observed_on_write"
