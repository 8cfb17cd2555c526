"""The Arrow engine (lakehouse.engines.arrow): write-audit-publish of small file loads with PyIceberg
and pyarrow, without a JVM. These tests are the fast lane's: the autouse guard in conftest fails
any of them that starts one, so "no JVM" is checked, not hoped for."""

from __future__ import annotations

import json
import textwrap

import pyarrow as pa
import pytest

from lakehouse.engines import choice as engines
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.stage.core import AuditFailed, ExtractPlan, FileRef
from lakehouse.stage.runner import StageRunner
from tests.test_wap_helpers import pyiceberg, rows_of

META = """
pipelines:
  - {pipeline_id: events_etl}
sources:
  - {source_id: events_raw, kind: files, format: jsonl, path: events, glob: "*.jsonl",
     promote_fields: [{path: extra.app, column: app}]}
targets:
  - {target_id: bronze_events, namespace: bronze, table: events, engine: ENGINE,
     partition_spec: [{column: country}]}
stages:
  - {pipeline_id: events_etl, stage_order: 1, stage_name: ingest, layer: bronze, source_id: events_raw,
     target_id: bronze_events, validation_set_id: event_rules}
validation_rules:
  - rule_set_id: event_rules
    rules:
RULES"""

RULES = """
- {name: id_present, type: not_null, columns: [id], action: quarantine, severity: warn}
- {name: id_unique, type: unique, columns: [id]}
- {name: amount_ok, type: range, column: amount, min: 0, severity: warn}
- {name: some_rows, type: row_count, min: 1}
"""


def apply(platform, tmp_path, engine="arrow", rules=RULES, meta=META):
    path = tmp_path / "meta.yaml"
    path.write_text(meta.replace("ENGINE", engine).replace(
        "RULES", textwrap.indent(textwrap.dedent(rules).strip(), "      ")) + "\n")
    platform.store.apply(load_metadata(path))


def event(i, **kw) -> dict:
    return {"id": i, "country": "de" if i % 2 else "fr", "amount": float(i), "ts": "2026-01-02T03:04:05Z",
            "extra": {"app": f"app{i % 3}", "n": i}, **kw}


def land(platform, name: str, rows: list[dict]):
    out = platform.settings.landing_dir / "events"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def lake(settings):
    """A platform with no SparkSession behind it (the fast lane has none)."""
    return Platform(settings, MetadataStore(settings.control_db_url))


def load(platform, run_id: str):
    runner = StageRunner(platform, "events_etl", "ingest", run_id)
    return runner.load(runner.extract())


def test_arrow_load_writes_audits_quarantines_and_publishes(lake, tmp_path):
    apply(lake, tmp_path)
    land(lake, "a", [event(1), event(2), {**event(3), "id": None}])
    out = load(lake, "r1")
    assert out.published and out.extra["engine"] == "arrow"
    assert "target bronze_events engine is arrow" in out.extra["engine_reason"]
    started = lake.store.audit_entries(run_id="r1", event="stage_started")
    assert started[0].details["engine"] == "arrow"  # the audit log says which engine ran and why
    rows = sorted(rows_of(lake, "bronze.events"), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == [1, 2]
    assert [r["app"] for r in rows] == ["app1", "app2"]  # promote_fields
    assert rows[0]["_source_file"].startswith("file://") and rows[0]["_source_file"].endswith("/events/a.jsonl")
    assert rows[0]["_ingested_at"] is not None
    q = rows_of(lake, "bronze.events__quarantine")
    assert [r["_failed_rules"] for r in q] == [["id_present"]] and q[0]["_run_id"] == "r1"
    checks = {c.rule.name: c for c in out.checks}
    assert checks["id_present"].failed_rows == 1 and checks["id_unique"].passed and checks["some_rows"].passed
    table = pyiceberg(lake).load_table("bronze.events")
    assert set(table.metadata.refs) == {"main"}  # the audit branch was published and dropped
    props = table.current_snapshot().summary.additional_properties
    assert props["lakehouse.run_id"] == "r1"
    assert [f["key"] for f in json.loads(props["lakehouse.files"])] == ["a.jsonl"]
    assert [f.name for f in table.spec().fields] == ["country"]

    # a second file: appended; the first is not loaded again (its checkpoint is on main)
    land(lake, "b", [event(4, amount=-1.0)])
    out2 = load(lake, "r2")
    assert sorted(r["id"] for r in rows_of(lake, "bronze.events")) == [1, 2, 4]
    assert not {c.rule.name: c for c in out2.checks}["amount_ok"].passed  # warn: published anyway
    assert out2.published


def test_failed_blocking_audit_keeps_branch_and_never_touches_main(lake, tmp_path):
    apply(lake, tmp_path, rules="- {name: enough, type: row_count, min: 100}")
    land(lake, "a", [event(1), event(2)])
    with pytest.raises(AuditFailed) as err:
        load(lake, "bad run")
    branch = err.value.branch
    table = pyiceberg(lake).load_table("bronze.events")
    assert branch in table.metadata.refs
    main = table.metadata.refs["main"].snapshot_id
    assert table.snapshot_by_id(main).summary.additional_properties.get("lakehouse.run_id") is None  # the empty fork point
    assert rows_of(lake, "bronze.events") == []
    assert len(rows_of(lake, "bronze.events", branch)) == 2
    from lakehouse.table.branches import kept

    assert "failed rule(s) enough" in kept(lake, "bronze.events")[branch]["reason"]  # kept for inspection


def choice(platform, size: int):
    runner = StageRunner(platform, "events_etl", "ingest", "choose")
    return engines.choose(runner, ExtractPlan("events_etl", "ingest", "files", files=[FileRef("a.jsonl", size, "e")]))


def test_auto_picks_arrow_below_the_threshold_and_spark_above_or_where_arrow_cannot(lake, tmp_path):
    apply(lake, tmp_path, engine="auto")
    small = choice(lake, 1000)
    assert (small.engine, small.asked) == ("arrow", "auto")
    assert small.reason == f"auto: 1000 bytes planned <= {engines.DEFAULT_ARROW_MAX_BYTES} (platform default)"
    big = choice(lake, engines.DEFAULT_ARROW_MAX_BYTES + 1)
    assert big.engine == "spark" and "planned >" in big.reason

    meta = META + "\nplatform_settings:\n  - {setting_key: engine.arrow_max_bytes, setting_value: '500'}\n"
    apply(lake, tmp_path, engine="auto", meta=meta)
    assert choice(lake, 1000).reason == "auto: 1000 bytes planned > 500 (platform setting engine.arrow_max_bytes)"

    apply(lake, tmp_path, engine="auto", rules="- {name: contract, type: schema_contract, "
                                                "expected_columns: [{name: id, type: bigint}]}")
    fallback = choice(lake, 10)
    assert fallback.engine == "spark" and "rule type(s) schema_contract are evaluated by Spark" in fallback.reason
    apply(lake, tmp_path, engine="auto", rules="- {name: sampled, type: expression, expression: 'rand() < amount'}")
    fallback = choice(lake, 10)
    assert fallback.engine == "spark" and "rule 'sampled': expression 'rand() < amount' is evaluated by Spark (rand() " \
        "answer differently on every evaluation" in fallback.reason
    apply(lake, tmp_path, engine="spark")
    assert choice(lake, 10).engine == "spark"
    apply(lake, tmp_path, engine="null")  # nothing said: the built-in default
    assert (choice(lake, 10).engine, choice(lake, 10).reason) == ("spark", "built-in default is spark")


def test_engine_arrow_where_arrow_cannot_write_is_refused_naming_file_and_field(tmp_path):
    path = tmp_path / "meta.yaml"
    path.write_text(META.replace("ENGINE", "arrow").replace("RULES", "      - {name: e, type: expression, "
                                                                      "expression: 'my_udf(amount)'}") + "\n")
    with pytest.raises(MetadataError) as err:
        load_metadata(path)
    assert (f"{path}: targets[0].engine: target 'bronze_events' asks for engine arrow, which cannot write stage "
            "events_etl.ingest: rule 'e': expression 'my_udf(amount)' is evaluated by Spark (function(s) my_udf "
            "have no known DuckDB equivalent") in str(err.value)
    path.write_text(META.replace("ENGINE", "auto").replace("RULES", "      - {name: n, type: row_count}") +
                    "\nplatform_settings:\n  - {setting_key: engine.default, setting_value: jvm}\n")
    with pytest.raises(MetadataError) as err:
        load_metadata(path)
    assert f"{path}: platform_settings[0]" in str(err.value)
    assert "engine.default: 'jvm' is not one of spark, arrow, auto" in str(err.value)


def test_lakehouse_run_of_an_arrow_pipeline_starts_no_jvm(lake, tmp_path, capsys):
    """`lakehouse run` end to end (Dagster job, IO manager, checks, run summary) in this process:
    the fast lane's guard fails the test if anything starts a JVM, the warm-up included."""
    import argparse

    from lakehouse_assets.cli import cmd_run

    apply(lake, tmp_path, engine="auto")
    land(lake, "a", [event(1), event(2), event(3)])
    code = cmd_run(argparse.Namespace(pipeline="events_etl", ephemeral=True, verbose=False))
    out = capsys.readouterr().out
    assert code == 0, out
    assert sorted(r["id"] for r in rows_of(lake, "bronze.events")) == [1, 2, 3]
    started = lake.store.audit_entries(event="stage_started")
    assert started[-1].details["engine"] == "arrow" and started[-1].details["engine_reason"].startswith("auto: ")
    # called in this process (not as its own command line), the run leaves pyarrow's pandas probes
    # alone: the test session may use pandas with pyarrow (lakehouse.runtime.pyarrow_probes)
    from lakehouse.runtime import pyarrow_probes

    assert not pyarrow_probes.applied()


@pytest.mark.parametrize("text,expected", [
    ("bigint", "bigint"), ("DECIMAL(10, 2)", "decimal(10,2)"), ("varchar(5)", "string"),
    ("array<struct<a:int,`b c`:map<string,double>>>", "array<struct<a:int,b c:map<string,double>>>"),
    ("timestamp_ntz", "timestamp_ntz"),
])
def test_declared_types_parse_without_a_jvm(text, expected):
    from lakehouse.ingest.prepare import _parse_type

    assert _parse_type(text).simpleString() == expected


@pytest.mark.parametrize("text", ["foo", "array<int", "int int", "struct<a:int", "int; drop table x"])
def test_a_declared_type_that_does_not_parse_is_named(text):
    from lakehouse.ingest.prepare import _parse_type

    with pytest.raises(ValueError, match="cannot parse type"):
        _parse_type(text)


def test_csv_timestamps_in_spark_spellings_load(lake, tmp_path):
    """The probe accepts what Spark's reader accepts ("2024-1-1 ...", a zone name after a space);
    the Arrow engine reads those values as Spark does, in the UTC session zone."""
    meta = META.replace("format: jsonl, path: events, glob: \"*.jsonl\",", "format: csv, path: events, glob: \"*.csv\","
                        " columns: [{name: id, type: bigint}, {name: country, type: string}, {name: ts, type: timestamp}],"
                        ).replace("\n     promote_fields: [{path: extra.app, column: app}]", "")
    apply(lake, tmp_path, rules="- {name: n, type: row_count, min: 1}", meta=meta)
    out = lake.settings.landing_dir / "events"
    out.mkdir(parents=True)
    (out / "a.csv").write_text("id,country,ts\n1,de,2024-1-1 10:00:00\n2,fr,2024-01-01 10:00:00 UTC\n"
                               "3,de,2024-01-01T11:00:00+01:00\n4,fr,\n")
    assert load(lake, "r1").published
    got = {r["id"]: r["ts"] for r in rows_of(lake, "bronze.events")}
    assert {k: (v.isoformat() if v else None) for k, v in got.items()} == {
        1: "2024-01-01T10:00:00+00:00", 2: "2024-01-01T10:00:00+00:00", 3: "2024-01-01T10:00:00+00:00", 4: None}


def test_a_large_jsonl_file_is_read_in_parallel_blocks_and_a_line_longer_than_a_block_still_reads(lake, tmp_path):
    """Files from 2 MB up are parsed in blocks (both cores; half the time at 15 MB): the table is
    the one a single block gives. A block holds at least two of the file's longest line, as the
    probe's: pyarrow refuses a line straddling two block boundaries (and can abort the process
    while doing so), so a file with a 3 MB line reads as before."""
    from lakehouse.engines.arrow.read import READ_BLOCK_BYTES, _read_file
    from lakehouse.metadata.model import Source

    source = Source(source_id="s", kind="files", format="jsonl", path="events")
    own = pa.schema([("id", pa.int64()), ("note", pa.string()), ("extra", pa.struct([("n", pa.int64())]))])
    rows = [{"id": i, "note": f"row {i} " + "x" * 40, "extra": {"n": i % 7}} for i in range(40_000)]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plain.stat().st_size >= 2 * READ_BLOCK_BYTES
    got = _read_file(source, str(plain), own)
    assert got.column("id").num_chunks > 1  # read in blocks
    assert got.combine_chunks().to_pylist() == rows

    long_line = {"id": -1, "note": "y" * (3 * READ_BLOCK_BYTES), "extra": {"n": 0}}
    longer = tmp_path / "longer.jsonl"
    longer.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:20_000], long_line, *rows[20_000:]]))
    got = _read_file(source, str(longer), own).combine_chunks().to_pylist()
    assert got == [*rows[:20_000], long_line, *rows[20_000:]]

    # end to end: such a file loads through the engine like any other
    apply(lake, tmp_path)
    land(lake, "big", [event(i) for i in range(1, 3)] + [{**event(3), "pad": "z" * (3 * READ_BLOCK_BYTES)}]
         + [event(i) for i in range(4, 30_000)])
    out = load(lake, "r1")
    assert out.published and out.extra["engine"] == "arrow"
    assert len(rows_of(lake, "bronze.events")) == 29_999


@pytest.mark.parametrize("keys", [
    ["a", "b", "c"], ["a", "b", "a"], ["a", None, None, "b"], [None, None], ["a", "a", None, "a", "b", "b"], [],
])
def test_unique_over_one_column_counts_as_sql_unique(keys):
    """One key column is answered by a hash of its values when nothing repeats; a repeat still gets
    the rows, the keys and the sample. NULL keys are not duplicates (SQL UNIQUE)."""
    from collections import Counter

    from lakehouse.engines.arrow.rules import _unique
    from lakehouse.validation.rules import Rule

    rule = Rule(name="u", type="unique", columns=["k"])
    counts = Counter(k for k in keys if k is not None)
    dup = {k: n for k, n in counts.items() if n > 1}
    out = _unique(rule, pa.table({"k": pa.array(keys, pa.string())}), len(keys))
    assert out.passed == (not dup)
    assert out.failed_rows == sum(dup.values()) and out.details == {"duplicate_keys": len(dup)}
    assert sorted((s["k"], s["rows"]) for s in out.sample) == sorted(dup.items())
    assert out.message == (f"{sum(dup.values())} rows share {len(dup)} duplicated key(s)" if dup else "all keys unique")


def test_expression_rules_are_evaluated_without_a_jvm_as_spark_does(lake, tmp_path):
    """`expression` rules run in DuckDB over the batch (Spark SQL carried over by sqlglot): NULL is
    failing, a CAST that fails is NULL, x / 0 is NULL, nested fields and timestamps compare as on
    Spark (the slow test_arrow_engine_spark compares both engines' counts). A quarantine action
    moves exactly the failing rows; an expression that is not boolean is named."""
    rules = RULES + """
- {name: app_known, type: expression, expression: "extra.app IN ('app0', 'app1')", action: quarantine, severity: warn}
- {name: numeric_country, type: expression, expression: "CAST(country AS DOUBLE) > 0", severity: warn}
- {name: ratio, type: expression, expression: "amount / (id - 2) > 0", severity: warn}
- {name: recent, type: expression, expression: "ts >= '2026-01-02 03:00:00'", severity: warn}
"""
    apply(lake, tmp_path, rules=rules)
    rows = [event(i) for i in range(1, 10)] + [{**event(10), "ts": "2026-01-01T00:00:00Z"}]
    land(lake, "a", rows)
    out = load(lake, "r1")
    assert out.published and out.extra["engine"] == "arrow"
    quarantined = [r for r in rows if r["extra"]["app"] not in ("app0", "app1")]
    assert sorted(r["id"] for r in rows_of(lake, "bronze.events__quarantine")) == sorted(r["id"] for r in quarantined)
    checks = {c.rule.name: c for c in out.checks}
    assert checks["app_known"].failed_rows == len(quarantined)
    kept = [r for r in rows if r not in quarantined]
    assert checks["numeric_country"].failed_rows == len(kept)  # CAST('de' AS DOUBLE) is NULL: every row fails
    assert checks["ratio"].failed_rows == sum(1 for r in kept if r["id"] <= 2)  # id 2: x / 0 is NULL
    assert checks["recent"].failed_rows == 1

    apply(lake, tmp_path, rules="- {name: not_bool, type: expression, expression: \"amount + 1\"}")
    land(lake, "b", [event(20)])
    with pytest.raises(AuditFailed, match="rule 'not_bool': expression 'amount \\+ 1' is double, not boolean"):
        load(lake, "r2")
