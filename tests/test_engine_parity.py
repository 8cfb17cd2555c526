"""Every rule kind through both engines' interface (lakehouse.engines.Engine) on the same rows.

The same small table of awkward values (NULLs, duplicates, mixed case, NaN, timestamps, dates) is
an Arrow table on the Arrow engine and a Spark DataFrame on the Spark engine; for every rule kind of
lakehouse.metadata.model the test asks each engine through the interface only:

* `tag_failures`: the rules each row fails (`_failed_rules`), row by row: the same on both;
* the rows a drop / quarantine rule keeps and sets aside: the same on both;
* `evaluate`: each rule's outcome (passed, failing rows, rows counted, message, sample): the same
  on both;
* the kinds the Arrow engine does not evaluate (referential_integrity reads another table,
  schema_contract compares Spark type names) are refused for it when the metadata is validated
  (lakehouse.metadata.engine_support), so no stage with such a rule ever reaches it.

Row rules and freshness are written once (lakehouse.validation.predicates); this test is what
holds the two renderings of each to the same answers.

`expression` rules have their own, larger corpus (tests/test_expression_parity.py); file loads
written by both engines are compared in tests/test_arrow_engine_spark.py. The fast tests at the end
hold the type model (Arrow -> Iceberg as Spark's catalog maps it) and the Arrow package's
independence from pyspark.
"""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.engines import Engine, engine_for
from lakehouse.metadata.model import ROW_RULES, Rule
from lakehouse.validation.rules import FAILED_RULES_COLUMN

ROOT = Path(__file__).resolve().parent.parent
UTC = dt.UTC

SCHEMA = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("s", pa.string()), ("d", pa.float64()),
                    ("day", pa.date32()), ("ts", pa.timestamp("us", tz="UTC"))])
ROWS = [
    {"id": 1, "n": 1, "s": "a", "d": 0.5, "day": dt.date(2024, 1, 1), "ts": dt.datetime(2024, 1, 1, tzinfo=UTC)},
    {"id": 2, "n": 2, "s": "b", "d": 1.5, "day": dt.date(2024, 1, 2), "ts": dt.datetime(2024, 1, 2, tzinfo=UTC)},
    {"id": 3, "n": None, "s": None, "d": None, "day": None, "ts": None},
    {"id": 4, "n": 2, "s": "B", "d": float("nan"), "day": dt.date(2023, 12, 31),
     "ts": dt.datetime(2023, 12, 31, 23, 59, 59, tzinfo=UTC)},
    {"id": 5, "n": 11, "s": "ab", "d": -1.0, "day": dt.date(2024, 2, 29), "ts": dt.datetime(2024, 2, 29, 12, tzinfo=UTC)},
    {"id": 6, "n": -3, "s": "a", "d": 10.0, "day": dt.date(2024, 1, 1), "ts": dt.datetime(1970, 1, 1, tzinfo=UTC)},
]

#: one or more rules of every kind the Arrow engine evaluates, row rules and dataset rules
RULES = [
    Rule(name="nn_s", type="not_null", columns=["s"]),
    Rule(name="nn_n_s", type="not_null", columns=["n", "s"]),
    Rule(name="av_s", type="accepted_values", column="s", values=["a", "b"]),
    Rule(name="av_n", type="accepted_values", column="n", values=[1, 2]),
    Rule(name="range_n", type="range", column="n", min=0, max=10),
    Rule(name="range_d_min", type="range", column="d", min=0.5),
    Rule(name="range_day", type="range", column="day", min="2024-01-01", max="2024-01-31"),
    Rule(name="regex_s", type="regex", column="s", pattern="^[ab]$"),
    Rule(name="regex_n", type="regex", column="n", pattern="^1"),
    Rule(name="regex_d", type="regex", column="d", pattern="^(NaN|10[.]0|-1[.]0)$"),
    Rule(name="regex_ts", type="regex", column="ts", pattern="^2024-0[12]-[0-9]{2} 00:00:00$"),
    Rule(name="regex_day", type="regex", column="day", pattern="^2024-01"),
    Rule(name="regex_escapes", type="regex", column="n", pattern=r"^\d$"),  # a backslash and a quote reach
    Rule(name="regex_quote", type="regex", column="s", pattern="^[^'b]+$"),  # both engines' SQL as written
    Rule(name="expr", type="expression", expression="n > 1 AND s <> 'b'"),
    Rule(name="expr_ts", type="expression", expression="ts >= '2024-01-01' OR day IS NULL"),
    Rule(name="bad_column", type="not_null", columns=["missing"]),
    Rule(name="row_count", type="row_count", min=1, max=3),
    Rule(name="row_count_ok", type="row_count", min=1),
    Rule(name="change", type="row_count_change", max_change_pct=10),
    Rule(name="unique_n", type="unique", columns=["n"]),
    Rule(name="unique_n_s", type="unique", columns=["n", "s"]),
    Rule(name="unique_s_ci", type="unique", columns=["S"]),
    Rule(name="fresh_ts", type="freshness", column="ts", max_age_seconds=3600),
    Rule(name="fresh_ts_ok", type="freshness", column="ts", max_age_seconds=86400 * 2),
    Rule(name="fresh_day", type="freshness", column="day", max_age_seconds=3600),
    Rule(name="fresh_text", type="freshness", column="s", max_age_seconds=3600),
]
#: what the freshness rules are measured against (naive UTC)
NOW = dt.datetime(2024, 3, 1, 6)
#: rule kinds only Spark evaluates: a stage with one is refused for the Arrow engine
SPARK_ONLY = [
    Rule(name="ri", type="referential_integrity", columns=["n"], ref_dataset="other", ref_columns=["n"]),
    Rule(name="contract", type="schema_contract", expected_columns=[{"name": "id", "type": "bigint"}]),
]


def test_every_rule_kind_is_covered():
    from typing import get_args

    from lakehouse.metadata.model import RuleType

    assert {r.type for r in RULES + SPARK_ONLY} == set(get_args(RuleType))


@pytest.fixture(scope="module")
def frames(spark):
    from pyspark.sql.pandas.types import from_arrow_schema

    table = pa.Table.from_pylist(ROWS, SCHEMA)
    df = spark.createDataFrame([tuple(r[f.name] for f in SCHEMA) for r in ROWS], schema=from_arrow_schema(SCHEMA))
    return {"arrow": table, "spark": df.cache()}


def _rows(engine: str, frame) -> list[dict]:
    if engine == "arrow":
        return frame.to_pylist()
    return [r.asDict(recursive=True) for r in frame.collect()]


@pytest.mark.slow
def test_both_engines_implement_the_interface():
    for name in ("spark", "arrow"):
        assert isinstance(engine_for(name), Engine), name


@pytest.mark.slow
def test_every_row_rule_tags_the_same_rows_on_both_engines(frames):
    tagged, errors = {}, {}
    for name in ("spark", "arrow"):
        errors[name] = {}
        out = engine_for(name).tag_failures(frames[name], RULES, errors[name], "UTC")
        tagged[name] = {r["id"]: sorted(r[FAILED_RULES_COLUMN]) for r in _rows(name, out)}
    assert tagged["arrow"] == tagged["spark"]
    assert set(errors["arrow"]) == set(errors["spark"]) == {"bad_column"}
    # every row rule fails some row and passes another: the table tells the engines apart
    row_rules = [r.name for r in RULES if r.type in ROW_RULES and r.name != "bad_column"]
    for rule in row_rules:
        failing = [i for i, names in tagged["spark"].items() if rule in names]
        assert 0 < len(failing) < len(ROWS), rule


@pytest.mark.slow
def test_every_rule_has_the_same_outcome_on_both_engines(frames):
    outcomes = {}
    for name in ("spark", "arrow"):
        frame = frames[name]
        context = {"table": frame, "previous_row_count": 5, "row_count_after": len(ROWS), "time_zone": "UTC",
                   "now": NOW}
        outcomes[name] = {o.rule.name: (o.passed, o.failed_rows, o.total_rows, o.message,
                                        sorted(r["id"] for r in o.sample if "id" in r))
                          for o in engine_for(name).evaluate(frame, RULES, context)}
    differ = {k: {"spark": outcomes["spark"][k], "arrow": outcomes["arrow"].get(k)}
              for k in outcomes["spark"] if outcomes["spark"][k] != outcomes["arrow"].get(k)}
    assert not differ, differ
    assert outcomes["arrow"]["bad_column"][:3] == (False, 0, 0)
    assert not outcomes["spark"]["unique_n"][0] and outcomes["spark"]["row_count_ok"][0]
    assert outcomes["spark"]["fresh_ts_ok"][0] and not outcomes["spark"]["fresh_ts"][0]
    assert outcomes["spark"]["fresh_ts"][1] == len(ROWS) and outcomes["spark"]["fresh_text"][3] == "no s values"


@pytest.mark.slow
def test_drop_and_quarantine_rules_split_the_same_rows_on_both_engines(frames):
    actions = {"nn_s": "quarantine", "range_n": "quarantine", "av_s": "drop", "regex_n": "drop", "expr": "warn"}
    acting = [r.model_copy(update={"action": actions[r.name]}) for r in RULES if r.name in actions]
    split = {}
    for name in ("spark", "arrow"):
        tagged = _rows(name, engine_for(name).tag_failures(frames[name], acting, {}, "UTC"))
        quarantine = {r.name for r in acting if r.action == "quarantine"}
        drop = {r.name for r in acting if r.action == "drop"}
        split[name] = {"quarantined": sorted(r["id"] for r in tagged if quarantine & set(r[FAILED_RULES_COLUMN])),
                       "kept": sorted(r["id"] for r in tagged if not (quarantine | drop) & set(r[FAILED_RULES_COLUMN])),
                       "tags": {r["id"]: r[FAILED_RULES_COLUMN] for r in tagged}}
    assert split["arrow"] == split["spark"]
    assert split["spark"]["quarantined"] and split["spark"]["kept"]


@pytest.mark.slow
def test_both_engines_conform_a_frame_to_a_table_schema_alike(frames):
    want = pa.schema([("S", pa.string()), ("id", pa.int32()), ("d", pa.float64()), ("extra", pa.string())])
    got = {name: _rows(name, engine_for(name).conform(frames[name], want)) for name in ("spark", "arrow")}

    def same(rows):  # NaN is not equal to itself
        return [{k: ("nan" if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in rows]

    assert same(got["arrow"]) == same(got["spark"])
    assert list(got["arrow"][0]) == ["S", "id", "d", "extra"]


def test_the_rule_kinds_only_spark_evaluates_are_refused_for_the_arrow_engine():
    from lakehouse.metadata.engine_support import rule_blockers

    for rule in SPARK_ONLY:
        assert rule_blockers([rule]), rule.type
    assert rule_blockers(RULES) == []


def test_the_arrow_package_imports_no_pyspark():
    """The Arrow engine works in Arrow and Iceberg schemas; Spark's types are met only through
    lakehouse.engines.types at its edge to the shared probe and reconciliation."""
    offenders = []
    for path in sorted((ROOT / "lakehouse" / "engines" / "arrow").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "pyspark"]
    assert not offenders


ARROW_TYPES = [pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
               pa.uint64(), pa.float32(), pa.float64(), pa.decimal128(12, 3), pa.string(), pa.large_string(),
               pa.binary(), pa.date32(), pa.timestamp("us", tz="UTC"), pa.timestamp("us"), pa.timestamp("ms", tz="UTC"),
               pa.list_(pa.int64()), pa.map_(pa.string(), pa.float64()),
               pa.struct([("a", pa.int32()), ("b", pa.list_(pa.struct([("c", pa.string())])))]),
               pa.dictionary(pa.int32(), pa.string())]


def test_arrow_schemas_map_to_the_iceberg_schema_spark_creates():
    """`arrow_to_iceberg` (no Spark types) gives the schema, field ids included, that reading the
    frame as Spark does and creating the table from it gave before (the Arrow engine's tables)."""
    from lakehouse.engines.types import arrow_to_iceberg, spark_schema, spark_to_iceberg

    schema = pa.schema([(f"c{i}", t) for i, t in enumerate(ARROW_TYPES)])
    assert arrow_to_iceberg(schema) == spark_to_iceberg(spark_schema(schema))
    with pytest.raises(ValueError, match="column 'ns': Illegal Parquet type"):
        arrow_to_iceberg(pa.schema([("ns", pa.timestamp("ns"))]))
    with pytest.raises(ValueError, match="column 'span': .*month_day_nano_interval"):
        arrow_to_iceberg(pa.schema([("span", pa.month_day_nano_interval())]))


def test_a_rule_is_one_predicate_rendered_for_each_engine_with_names_and_values_quoted():
    """The one definition (lakehouse.validation.predicates): identifiers quoted, values typed
    literals, in Spark SQL and in DuckDB; an odd column name and a value with quotes stay data."""
    from lakehouse.engines.arrow.rules import passes
    from lakehouse.sql.parse import condition_to_duckdb
    from lakehouse.validation.predicates import row_predicate

    odd = "we`ird \"col'"
    # metadata refuses such a column name (model.check_column); the predicate quotes it all the same
    rule = Rule.model_construct(name="av", type="accepted_values", column=odd, values=["it's", 'x") OR (1=1'])
    tree = row_predicate(rule, [odd])
    assert tree.sql(dialect="spark") == "COALESCE((`we``ird \"col'` IN ('it\\'s', 'x\") OR (1=1')), FALSE)"
    assert condition_to_duckdb(tree).sql(dialect="duckdb") == \
        "COALESCE((\"we`ird \"\"col'\" IN ('it''s', 'x\") OR (1=1')), FALSE)"
    table = pa.table({odd: ["it's", 'x") OR (1=1', "y", None]})
    assert passes(rule, table).to_pylist() == [True, True, False, False]
    ranged = Rule(name="r", type="range", column="n", min=0.5, max=10)
    assert row_predicate(ranged, ["n"]).sql(dialect="spark") == \
        "COALESCE((`n` >= CAST('0.5' AS DOUBLE) AND `n` <= CAST('10.0' AS DOUBLE)), FALSE)"
