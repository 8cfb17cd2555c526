"""One test per failure of issue 16, on real Spark + Iceberg: a drifted file never blocks the
source, no column is lost, the schema policies decide per file, a 50 MB JSON field quarantines
its file, a hung Spark job ends within the step's timeout, and a rule that cannot be evaluated
fails only its own check."""

from __future__ import annotations

import io
import json
import time
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakehouse.control import faults
from lakehouse.errors import STEP_TIMEOUT, StepTimeout
from lakehouse.ingest.checkpoints import Checkpoints
from lakehouse.ingest.files import PROCESSED
from lakehouse.ingest.prepare import SchemaPolicyViolation
from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.runner import AuditFailed, StageRunner

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()
    yield
    faults.reset()


def apply(platform, tmp_path, ns: str, *, fmt: str = "parquet", source_extra: str = "", target_extra: str = "",
          stage_extra: str = "", rules: str = "") -> str:
    text = f"""
pipelines:
  - {{pipeline_id: p}}
sources:
  - {{source_id: raw, kind: files, format: {fmt}, path: in, glob: "*.{fmt}"{source_extra}}}
targets:
  - {{target_id: bronze_t, namespace: b_{ns}, table: events, write_mode: append{target_extra}}}
stages:
  - {{pipeline_id: p, stage_order: 1, stage_name: ingest, layer: bronze, source_id: raw, target_id: bronze_t{stage_extra}}}
"""
    if rules:
        text += "validation_rules:\n  - rule_set_id: rs\n    rules:\n" + "".join(f"      - {r}\n" for r in rules)
        text = text.replace("target_id: bronze_t}", "target_id: bronze_t, validation_set_id: rs}")
    path = tmp_path / f"meta_{abs(hash(text)) % 10**8}.yaml"
    path.write_text(text)
    platform.store.apply(load_metadata(path))
    (platform.settings.landing_dir / "in").mkdir(parents=True, exist_ok=True)
    return f"b_{ns}.events"


def land(platform, name: str, rows: list[dict] | None = None, table: pa.Table | None = None) -> None:
    path = platform.settings.landing_dir / "in" / name
    if name.endswith(".parquet"):
        buf = io.BytesIO()
        pq.write_table(table if table is not None else pa.Table.from_pylist(rows), buf)
        path.write_bytes(buf.getvalue())
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run(platform):
    r = StageRunner(platform, "p", "ingest")
    plan = r.extract()
    return r, plan, r.load(plan)


def table_rows(platform, ident: str) -> list[dict]:
    return platform.pyiceberg_catalog().load_table(ident).scan().to_arrow().to_pylist()


def columns(platform, ident: str) -> list[str]:
    return [f.name for f in platform.pyiceberg_catalog().load_table(ident).schema().fields]


def status(platform, ident: str) -> dict[str, tuple[str, str | None]]:
    return {r["file_key"]: (r["status"], r["error"]) for r in Checkpoints(platform, ident).rows()}


def events(stem: str, n: int = 3, amount=None, **extra) -> list[dict]:
    return [{"id": f"{stem}-{i}", "amount": float(i) if amount is None else amount, "event_type": "view", **extra}
            for i in range(n)]


@pytest.mark.parametrize("declared", [False, True])
def test_a_drifted_file_is_quarantined_alone_and_never_replanned(platform, tmp_path, unique_ns, declared):
    extra = (", columns: [{name: id, type: string}, {name: amount, type: double}, {name: event_type, type: string}]"
             if declared else "")
    ident = apply(platform, tmp_path, unique_ns + str(int(declared)), source_extra=extra)
    for i in range(3):
        land(platform, f"a{i}.parquet", events(f"a{i}"))
    run(platform)
    # a column whose type changed (double -> string): issue 16's drift_type_change.parquet
    land(platform, "b0_drift_type_change.parquet", events("drift", amount="12.50"))
    for i in range(2):
        land(platform, f"b{i + 1}.parquet", events(f"b{i + 1}"))
    r, plan, out = run(platform)
    assert out.published and out.rows_written == 6
    assert status(platform, ident)["b0_drift_type_change.parquet"] == (
        "quarantined", "unsafe type change: column amount: expected double, found string")
    assert sorted(x["id"] for x in table_rows(platform, ident) if x["id"].startswith("drift")) == []
    assert len(table_rows(platform, ident)) == 15
    [ev] = platform.store.audit_entries(run_id=r.run_id, event="file_quarantined")
    assert ev.error_class == "SchemaDrift" and ev.message.startswith("b0_drift_type_change.parquet: ")
    # the rerun does not plan it again
    _, plan, out = run(platform)
    assert plan.skipped_reason and out.rows_written == 0


def test_quoted_decimals_in_json_lines_load_into_a_decimal_column(platform, tmp_path, unique_ns):
    """A JSON source whose amounts are strings ("12.50", as many exporters write decimals) loads
    into its declared decimal column, as Spark's JSON reader reads it; a file with an amount
    Spark cannot read as that decimal is quarantined alone, naming line, column and value."""
    ident = apply(platform, tmp_path, unique_ns, fmt="jsonl",
                  source_extra=', columns: [{name: id, type: string}, {name: amount, type: "decimal(8,2)"}]')
    land(platform, "a.jsonl", [{"id": "a0", "amount": "12.50"}, {"id": "a1", "amount": "1,234.5"},
                               {"id": "a2", "amount": 3.25}, {"id": "a3", "amount": None}])
    land(platform, "b.jsonl", [{"id": "b0", "amount": "12.5"}, {"id": "b1", "amount": "n/a"}])
    r, _, out = run(platform)
    assert out.published and out.rows_written == 4
    rows = {x["id"]: x["amount"] for x in table_rows(platform, ident)}
    assert rows == {"a0": Decimal("12.50"), "a1": Decimal("1234.50"), "a2": Decimal("3.25"), "a3": None}
    assert status(platform, ident)["b.jsonl"] == (
        "quarantined", 'line 2: column amount: value "n/a" cannot be read as decimal(8,2)')


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_the_probe_passes_exactly_the_decimals_spark_reads(spark, tmp_path, fmt):
    """The probe's decimal check against Spark's own reader (FAILFAST, the platform's reader options),
    spelling by spelling: a value the probe passes must load, a value it refuses must fail in Spark."""
    from pyspark.sql.types import DecimalType, StructField, StructType

    from lakehouse.ingest.prepare import _reader
    from lakehouse.ingest.probe import probe_file
    from lakehouse.metadata.model import FileLimits, Source

    texts = ["12.50", "-1,234.5", ".5", "+3.", "1E+2", "9999.994", "9999.995", "-0.004", " 12.5", "12.5 ",
             "NaN", "Infinity", "1_000", "abc", "0x10", "1e-400", "12.5.1", "1,2,3"]
    if fmt == "jsonl":  # as JSON strings, plus bare JSON numbers
        values = [json.dumps(t) for t in texts] + ["12.345", "99999.99", "100000", "1e2", "-7"]
    else:
        values = [f'"{t}"' for t in texts]
    source = Source(source_id="s", kind="files", format=fmt, path="x")
    schema = StructType([StructField("amount", DecimalType(6, 2))])
    verdicts = {}
    for i, v in enumerate(values):
        path = tmp_path / f"v{i}.{fmt}"
        path.write_text(f'{{"amount": {v}}}\n' if fmt == "jsonl" else f"amount\n{v}\n")
        probed = probe_file(path, fmt, limits=FileLimits(), expect={"amount": schema["amount"].dataType})
        try:
            _reader(spark, source, schema, [str(path)]).collect()
            read = True
        except Exception:  # noqa: BLE001 - Spark refused the value
            read = False
        verdicts[v] = (probed.status == PROCESSED, read)
    assert {v: p for v, (p, _) in verdicts.items()} == {v: r for v, (_, r) in verdicts.items()}
    assert sum(r for _, r in verdicts.values()) >= 6  # both kinds of verdict were exercised
    assert sum(not r for _, r in verdicts.values()) >= 6


DATETIME_TEXTS = [
    "2024-01-01", "2024-1-1", "2024-01-01T00:00:00", "2024-01-01 00:00:00", "2024-01-01T00:00:00Z",
    "2024-01-01T00:00:00+02:00", "2024-01-01T00:00:00.123456", "2024-01-01T00:00:00.1234567", "2024-01-01T00:00",
    "2024-01-01T", " 2024-01-01 ", "20240101", "2024", "2024-01", "+2024-01-01", "-0044-03-15", "12024-01-01",
    "1234567-01-01", "2024-13-01", "2024-02-30", "2023-02-29", "2024-02-29", "2024-01-01T24:00:00",
    "2024-01-01T23:59:60", "2024-01-01T00:00:00 UTC", "2024-01-01T00:00:00 Europe/Paris",
    "2024-01-01T00:00:00 Mars/Olympus", "2024-01-01T00:00:00GMT+01:00", "2024-01-01T00:00:00+1:00",
    "2024-01-01T00:00:00PST", "2024-01-01T00:00:00+19:00", "2024-01-01T00:00:00z", "12:30:00", "T12:30:00",
    "2024-01-01Tfoo", "2024/01/01", "01/01/2024", "abc", "2024-01-01T00:00:00.", "1700000000",
    "2024-01-01T12:00:00.5+05:30", "2024-01-01 12:00:00 +05", "2024-01-01T00:00:00UTC+3", "-5", "+19000",
    "2147483648", "1e3",
]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_the_probe_passes_exactly_the_datetimes_spark_reads(spark, tmp_path, fmt):
    """The probe's timestamp, timestamp_ntz and date checks against Spark's own JSON and CSV readers,
    spelling by spelling (and JSON numbers, which only a timestamp takes). One PERMISSIVE read per
    type marks each row Spark could not convert, with the conversions FAILFAST uses."""
    # EXCEPTION (the default) fails the whole read, even PERMISSIVE, where the new parser refuses a text
    # the pre-3.0 one took ("2024-13-01"); CORRECTED refuses the same texts row by row
    policy = spark.conf.get("spark.sql.legacy.timeParserPolicy")
    spark.conf.set("spark.sql.legacy.timeParserPolicy", "CORRECTED")
    try:
        verdicts = _datetime_verdicts(spark, tmp_path, fmt)
    finally:
        spark.conf.set("spark.sql.legacy.timeParserPolicy", policy)
    wrong = {k: f"probe {p}, Spark {r}" for k, (p, r) in verdicts.items() if p != r}
    assert wrong == {}
    assert sum(r for _, r in verdicts.values()) >= 30  # both verdicts exercised for every type
    assert sum(not r for _, r in verdicts.values()) >= 30


def _datetime_verdicts(spark, tmp_path, fmt):
    from pyspark.sql.types import DateType, StringType, StructField, StructType, TimestampNTZType, TimestampType

    from lakehouse.ingest.probe import probe_file
    from lakehouse.metadata.model import FileLimits

    values = [json.dumps(t) for t in DATETIME_TEXTS]
    if fmt == "jsonl":
        values += ["1700000000", "-5", "1.5", "true", str(2**63 - 1), str(2**63)]
    verdicts = {}
    for dtype in (TimestampType(), TimestampNTZType(), DateType()):
        path = tmp_path / f"{dtype.typeName()}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(f'{{"i": "{i}", "v": {v}}}\n' for i, v in enumerate(values)))
        else:
            path.write_text("i,v\n" + "".join(f"{i},{v}\n" for i, v in enumerate(values)))
        schema = StructType([StructField("i", StringType()), StructField("v", dtype), StructField("_bad", StringType())])
        reader = spark.read.schema(schema).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", "_bad")
        if fmt == "csv":
            reader = reader.option("header", "true").option("escape", '"')
        df = (reader.csv if fmt == "csv" else reader.json)(str(path))  # v as text: years Python cannot hold
        rows = {r["i"]: r["_bad"] is None for r in df.select("i", df.v.cast("string"), "_bad").collect()}
        assert len(rows) == len(values)
        for i, v in enumerate(values):
            one = tmp_path / f"one.{fmt}"
            one.write_text(f'{{"v": {v}}}\n' if fmt == "jsonl" else f"v\n{v}\n")
            probed = probe_file(one, fmt, limits=FileLimits(), expect={"v": dtype})
            verdicts[(dtype.simpleString(), v)] = (probed.status == PROCESSED, rows[str(i)])
    return verdicts


def test_no_column_is_lost_even_one_file_per_commit(platform, tmp_path, unique_ns):
    """batch_files 1: the first file lacks event_type, later ones bring it, a nested struct, new
    nested fields and hostile names; the next run brings a new nested field to an existing table."""
    ident = apply(platform, tmp_path, unique_ns, fmt="jsonl", source_extra=", batch_files: 1")
    land(platform, "e0.jsonl", [{"id": "e0", "amount": 1.5}])
    land(platform, "e1.jsonl", [{"id": "e1", "amount": 2, "event_type": "click"}])
    land(platform, "e2.jsonl", [{"id": "e2", "coupon_code": "SAVE", "extra": {"channel": "web"}}])
    land(platform, "e3.jsonl", [{"id": "e3", "extra": {"channel": "app", "score": 0.5},
                                 "größe": "XL", "select": "kw", "a.b c-d": "p"}])
    _, _, out = run(platform)
    assert out.published and len(out.writes) == 4
    got = {r["id"]: r for r in table_rows(platform, ident)}
    assert got["e0"]["event_type"] is None and got["e1"]["event_type"] == "click" and got["e1"]["amount"] == 2.0
    assert got["e2"]["coupon_code"] == "SAVE" and got["e2"]["extra"] == {"channel": "web", "score": None}
    assert got["e3"]["extra"] == {"channel": "app", "score": 0.5}
    assert (got["e3"]["größe"], got["e3"]["select"], got["e3"]["a.b c-d"]) == ("XL", "kw", "p")
    land(platform, "e4.jsonl", [{"id": "e4", "extra": {"channel": "web", "campaign": "c1"}, "qty": 3}])
    r, _, out = run(platform)
    got = {r["id"]: r for r in table_rows(platform, ident)}
    assert got["e4"]["extra"] == {"channel": "web", "score": None, "campaign": "c1"} and got["e4"]["qty"] == 3
    assert got["e0"]["extra"] is None
    [ev] = platform.store.audit_entries(run_id=r.run_id, event="schema_evolved")
    assert {(c["kind"], c["column"]) for c in ev.details["changes"]} == {("new", "extra.campaign"), ("new", "qty")}
    assert out.extra["schema_changes"] == ["new column extra.campaign (string)", "new column qty (bigint)"]


def test_freeze_quarantines_files_with_new_columns(platform, tmp_path, unique_ns):
    ident = apply(platform, tmp_path, unique_ns, target_extra=", table_properties: {lakehouse.schema_policy: freeze}")
    land(platform, "a.parquet", events("a"))
    run(platform)
    land(platform, "b.parquet", events("b", coupon_code="X"))
    land(platform, "c.parquet", events("c"))
    _, _, out = run(platform)
    assert out.published and out.rows_written == 3
    assert status(platform, ident)["b.parquet"] == ("quarantined", "new column coupon_code (string) (schema policy freeze)")
    assert "coupon_code" not in columns(platform, ident)


def test_fail_policy_fails_the_stage_naming_file_and_column(platform, tmp_path, unique_ns):
    ident = apply(platform, tmp_path, unique_ns, target_extra=", table_properties: {lakehouse.schema_policy: fail}")
    land(platform, "a.parquet", events("a"))
    run(platform)
    before = platform.tables().snapshot_id(ident)
    land(platform, "b.parquet", events("b", coupon_code="X"))
    r = StageRunner(platform, "p", "ingest")
    with pytest.raises(SchemaPolicyViolation, match=r"b\.parquet: new column coupon_code \(string\) "
                                                    r"\(schema policy fail\)\. Nothing was written"):
        r.load(r.extract())
    assert platform.tables().snapshot_id(ident) == before and "coupon_code" not in columns(platform, ident)


def test_a_50mb_json_field_quarantines_its_file_with_the_limit_named(platform, tmp_path, unique_ns):
    """Spark's JSON parser refuses strings over 20,000,000 characters and failed the whole batch;
    the default limit (16 MiB characters) quarantines the file before Spark sees it. The file is
    the unit of quarantine: its good row is recorded with the file, not loaded without it."""
    ident = apply(platform, tmp_path, unique_ns, fmt="jsonl")
    land(platform, "big.jsonl", [{"id": "big-0", "amount": 1.0}, {"id": "big-1", "payload": "x" * (50 * 1024**2)}])
    land(platform, "small.jsonl", [{"id": "small-0", "amount": 2.0}])
    _, _, out = run(platform)
    assert out.published and [r["id"] for r in table_rows(platform, ident)] == ["small-0"]
    state, error = status(platform, ident)["big.jsonl"]
    assert state == "quarantined"
    assert error == ("over a limit: line 2: a value of 52428800 characters in payload exceeds the limit "
                     "max_field_chars=16777216")
    assert (platform.settings.landing_dir / "in" / "big.jsonl").exists()  # kept where it landed


def test_a_hung_spark_job_ends_within_the_step_timeout(platform, tmp_path, unique_ns, monkeypatch):
    """A Spark job that never finishes (a task sleeping for an hour in the JVM, as a job whose
    task-result thread died would wait) is cancelled when the stage's timeout passes; the step
    fails with a clear message and the error reaches the healing rules as STEP_TIMEOUT."""
    apply(platform, tmp_path, unique_ns, fmt="jsonl", stage_extra=", timeout_seconds: 20")
    land(platform, "a.jsonl", [{"id": "a"}])
    monkeypatch.setenv(faults.ENV, "hang:seconds=3600")
    r = StageRunner(platform, "p", "ingest")
    plan = r.extract()
    t0 = time.monotonic()
    with pytest.raises(StepTimeout) as err:
        r.load(plan)
    elapsed = time.monotonic() - t0
    assert 20 <= elapsed < 20 + 90, elapsed  # cancelled at the deadline (slack for a loaded 2-core machine)
    assert "p.ingest load: its Spark work ran longer than the step's timeout of 20 s " \
           "(stages.timeout_seconds in the metadata) and was cancelled" in str(err.value)
    [healing] = platform.store.audit_entries(run_id=r.run_id, event="healing")
    assert healing.outcome == "unhealed" and healing.details["code"] == STEP_TIMEOUT
    # the session is fine afterwards: the next step of the run can use it
    assert platform.spark().range(3).count() == 3


def test_a_deadline_entered_before_spark_started_binds_to_the_session_when_the_work_starts_it(platform, monkeypatch):
    """A step enters its deadline without starting the JVM (`lakehouse run` warms one up on another
    thread; a step may need none): the job group is set when the step's work first gets the session,
    so a hung job the work then starts is still cancelled by the deadline."""
    from lakehouse.control.deadline import Deadline, spark_deadline
    from lakehouse.runtime import spark as spark_mod

    monkeypatch.setattr(spark_mod, "_SESSION", None)  # as if no step had started Spark in this process
    assert spark_mod.active_session() is None
    with pytest.raises(StepTimeout) as err:
        with spark_deadline(spark_mod.active_session(), Deadline(3.0, "a test deadline"), "p.s load"):
            session = spark_mod.get_spark(platform.settings)  # the work starts Spark: the group binds now
            session.range(1).selectExpr("reflect('java.lang.Thread', 'sleep', CAST(600000 AS BIGINT))").collect()
    assert "p.s load: its Spark work ran longer than the step's timeout of 3 s (a test deadline)" in str(err.value)
    assert "cancelled part of cancelled job group lakehouse-" in str(err.value.__cause__)
    # the group is gone from the thread afterwards: later jobs are nobody's step
    assert session.sparkContext.getLocalProperty("spark.jobGroup.id") is None
    assert session.range(3).count() == 3


def test_rules_that_cannot_be_evaluated_fail_only_their_own_check(platform, tmp_path, unique_ns):
    rules = ["{name: enough, type: row_count, min: 1, severity: error}",
             "{name: random_pick, type: expression, expression: 'rand() < 2', severity: warn}",
             "{name: boom, type: expression, expression: \"raise_error('boom') IS NULL\", severity: warn}",
             "{name: amount_cap, type: expression, expression: 'amount < 100', severity: warn}"]
    ident = apply(platform, tmp_path, unique_ns, fmt="jsonl", rules=rules)
    land(platform, "a.jsonl", events("a"))
    _, _, out = run(platform)
    assert out.published and len(table_rows(platform, ident)) == 3  # the write follows the other rules
    checks = {c.rule.name: c for c in out.checks}
    assert checks["enough"].passed and checks["amount_cap"].passed
    assert not checks["random_pick"].passed and "is not deterministic" in checks["random_pick"].message
    assert not checks["boom"].passed and "could not be evaluated" in checks["boom"].message
    assert "boom" in checks["boom"].details["error"]
    # the same rule at error severity blocks the publish, with its reason
    apply(platform, tmp_path, unique_ns, fmt="jsonl", rules=rules[:1] + [rules[1].replace("warn", "error")])
    land(platform, "b.jsonl", events("b"))
    with pytest.raises(AuditFailed, match="random_pick: rule 'random_pick': expression 'rand\\(\\) < 2' is not "
                                          "deterministic"):
        run(platform)


def test_a_first_run_whose_files_are_all_quarantined_skips_downstream_with_the_reason(platform, tmp_path, unique_ns):
    """Nothing published upstream yet (every file quarantined): the SQL stage below skips, naming the
    missing table, instead of failing on it; both run once a good file lands."""
    ident = f"b_{unique_ns}.events"
    (tmp_path / "both.yaml").write_text(f"""
pipelines:
  - {{pipeline_id: p}}
sources:
  - {{source_id: raw, kind: files, format: jsonl, path: in, glob: "*.jsonl"}}
targets:
  - {{target_id: bronze_t, namespace: b_{unique_ns}, table: events, write_mode: append}}
  - {{target_id: silver_t, namespace: s_{unique_ns}, table: events, write_mode: overwrite}}
stages:
  - {{pipeline_id: p, stage_order: 1, stage_name: ingest, layer: bronze, source_id: raw, target_id: bronze_t}}
  - pipeline_id: p
    stage_order: 2
    stage_name: clean
    layer: silver
    target_id: silver_t
    transformation: "SELECT id, amount FROM {ident} WHERE id IS NOT NULL"
""")
    platform.store.apply(load_metadata(tmp_path / "both.yaml"))
    (platform.settings.landing_dir / "in").mkdir(parents=True, exist_ok=True)
    (platform.settings.landing_dir / "in" / "bad.jsonl").write_text('{"id": "a", "amount": \n garbage\n')

    _, _, bronze = run(platform)
    assert not platform.tables().exists(ident)
    assert bronze.skipped_reason.startswith("no readable input: 1 file(s) quarantined (bad.jsonl")
    silver = StageRunner(platform, "p", "clean")
    plan = silver.extract()
    outcome = silver.load(plan)
    assert outcome.skipped_reason and f"upstream {ident} does not exist yet" in outcome.skipped_reason
    assert not platform.tables().exists(f"s_{unique_ns}.events")
    logged = platform.store.audit_entries(run_id=silver.run_id, event="upstream_missing")
    assert [e.dataset for e in logged] == [f"s_{unique_ns}.events"] and ident in logged[0].message

    land(platform, "good.jsonl", events("g"))
    assert run(platform)[2].rows_written == 3
    silver = StageRunner(platform, "p", "clean")
    assert silver.load(silver.extract()).rows_written == 3
    assert sorted(r["id"] for r in table_rows(platform, f"s_{unique_ns}.events")) == ["g-0", "g-1", "g-2"]
