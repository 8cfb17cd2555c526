"""Seed 003's dated ingest (issue 43 item 3): `lakehouse ingest SOURCE --date D` loads exactly that
day's prefix of a Hive-style dated landing, exactly once (the file checkpoints); other days stay
unloaded until asked for; the declared `name=value` path segments are typed columns of the Iceberg
table. On the Arrow engine (fast lane: no JVM), on moto S3, and on Spark (slow)."""

from __future__ import annotations

import datetime as dt
import json
import textwrap

import pyarrow as pa
import pytest
from pyiceberg.types import IntegerType, LongType, StringType

from lakehouse.ingest import dated
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.stage.runner import StageRunner
from tests.test_wap_helpers import cli, pyiceberg, rows_of

META = """
pipelines:
  - {pipeline_id: daily_etl}
sources:
  - source_id: daily_raw
    kind: KIND
    format: jsonl
    LOCATION
    glob: "*.jsonl"
    dated_layout: "year={yyyy}/month={mm}/day={dd}"
    path_columns:
      - {name: year, type: int}
      - {name: month, type: int}
      - {name: day, type: bigint}
      - {name: region, type: string}
targets:
  - {target_id: bronze_daily, namespace: bronze, table: daily, engine: ENGINE}
stages:
  - {pipeline_id: daily_etl, stage_order: 1, stage_name: ingest, layer: bronze, source_id: daily_raw,
     target_id: bronze_daily}
"""

DAYS = [dt.date(2025, 12, 28), dt.date(2025, 12, 29), dt.date(2025, 12, 30)]


def apply(platform, tmp_path, engine: str, kind: str = "files", location: str = "path: daily") -> None:
    path = tmp_path / "meta.yaml"
    path.write_text(META.replace("ENGINE", engine).replace("KIND", kind).replace("LOCATION", location))
    platform.store.apply(load_metadata(path))


def day_files(day: dt.date) -> dict[str, str]:
    """Two files a day (one under a region=... sub-folder): {key under the root: jsonl text}."""
    base = f"year={day.year}/month={day.month:02d}/day={day.day:02d}"
    rows = lambda tag: "".join(json.dumps({"id": f"{day}-{tag}-{i}", "n": i}) + "\n" for i in range(3))  # noqa: E731
    return {f"{base}/a.jsonl": rows("a"), f"{base}/region=eu/b.jsonl": rows("b")}


def land_local(platform) -> None:
    root = platform.settings.landing_dir / "daily"
    for day in DAYS:
        for key, text in day_files(day).items():
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_text(text)


def check_day_twice(platform, ingest) -> None:
    """The proof, whatever the engine or the source kind: `ingest(day)` runs the CLI or a runner."""
    ingest(DAYS[1])
    rows = rows_of(platform, "bronze.daily")
    assert sorted(r["id"] for r in rows) == sorted(f"{DAYS[1]}-{t}-{i}" for t in "ab" for i in range(3))
    assert {(r["year"], r["month"], r["day"]) for r in rows} == {(2025, 12, 29)}
    for r in rows:  # each row's region is its own file's
        assert r["region"] == ("eu" if "-b-" in r["id"] else None)
    schema = pyiceberg(platform).load_table("bronze.daily").schema()
    assert isinstance(schema.find_field("year").field_type, IntegerType)
    assert isinstance(schema.find_field("month").field_type, IntegerType)
    assert isinstance(schema.find_field("day").field_type, LongType)
    assert isinstance(schema.find_field("region").field_type, StringType)
    snapshots = len(pyiceberg(platform).load_table("bronze.daily").snapshots())

    ingest(DAYS[1])  # the same day again: nothing new
    assert len(rows_of(platform, "bronze.daily")) == 6
    assert len(pyiceberg(platform).load_table("bronze.daily").snapshots()) == snapshots

    ingest(DAYS[0])  # the other day, untouched until asked for, then loaded once
    got = {r["id"][:10] for r in rows_of(platform, "bronze.daily")}
    assert got == {str(DAYS[0]), str(DAYS[1])}
    assert len(rows_of(platform, "bronze.daily")) == 12


@pytest.fixture
def lake(settings):
    """A platform with no SparkSession behind it (the fast lane has none)."""
    return Platform(settings, MetadataStore(settings.control_db_url))


def test_cli_ingests_one_day_once_with_typed_path_columns_on_arrow(lake, tmp_path):
    apply(lake, tmp_path, "arrow")
    land_local(lake)
    outputs = []

    def ingest(day):
        rc, out = cli("ingest", "daily_raw", "--date", day.isoformat())
        assert rc == 0, out
        outputs.append(out)

    check_day_twice(lake, ingest)
    assert "no new files" in outputs[1]  # the second run of the day was skipped, not rewritten


def test_dated_ingest_on_s3(lake, tmp_path, s3_server, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    apply(lake, tmp_path, "arrow", kind="s3", location=f"bucket: {bucket}\n    prefix: landing/daily/")
    client = s3_server.client()
    for day in DAYS:
        for key, text in day_files(day).items():
            client.put_object(Bucket=bucket, Key=f"landing/daily/{key}", Body=text.encode())

    def ingest(day):
        runner = StageRunner(lake, "daily_etl", "ingest", run_tags={dated.DATE_TAG: day.isoformat()})
        out = runner.load(runner.extract())
        assert out.published or out.skipped_reason

    check_day_twice(lake, ingest)


@pytest.mark.slow
def test_dated_ingest_on_spark(platform, tmp_path):
    apply(platform, tmp_path, "spark")
    land_local(platform)

    def ingest(day):
        runner = StageRunner(platform, "daily_etl", "ingest", run_tags={dated.DATE_TAG: day.isoformat()})
        out = runner.load(runner.extract())
        assert out.published or out.skipped_reason
        if out.published and not out.skipped_reason:
            assert out.extra.get("engine", "spark") == "spark"

    check_day_twice(platform, ingest)


def test_cli_refuses_a_date_for_an_undated_source_and_a_bad_day(lake, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent("""
        pipelines: [{pipeline_id: p}]
        sources: [{source_id: plain, kind: files, format: jsonl, path: plain}]
        targets: [{target_id: t, namespace: bronze, table: t, engine: arrow}]
        stages: [{pipeline_id: p, stage_order: 1, stage_name: s, layer: bronze, source_id: plain, target_id: t}]
    """))
    lake.store.apply(load_metadata(path))
    rc, _ = cli("ingest", "plain", "--date", "2025-12-29")
    assert rc == 2
    apply(lake, tmp_path, "arrow")
    rc, _ = cli("ingest", "daily_raw", "--date", "2025-13-40")
    assert rc == 2
    rc, _ = cli("ingest", "nope", "--date", "2025-12-29")
    assert rc == 2


@pytest.mark.parametrize(("fields", "message"), [
    ('dated_layout: "year={yyyy}/month={mm}"', "dated_layout 'year={yyyy}/month={mm}': missing ['{dd}']"),
    ('dated_layout: "{yyyy}/{week}/{mm}/{dd}"', "unknown placeholder(s) ['{week}']"),
    ('dated_layout: "../{yyyy}/{mm}/{dd}"', "without '..'"),
    ("path_columns: [{name: year, type: float}]", "path_columns"),
    ("path_columns: [{name: 'bad name'}]", "path_columns name 'bad name'"),
    ("path_columns: [{name: year}, {name: YEAR}]", "a column named twice"),
    ("path_columns: [{name: _source_file}]", "already a declared, promoted or lineage column"),
])
def test_metadata_errors_name_the_field(tmp_path, fields, message):
    path = tmp_path / "m.yaml"
    path.write_text(f"sources:\n  - source_id: s\n    kind: files\n    format: jsonl\n    path: x\n    {fields}\n")
    with pytest.raises(MetadataError) as err:
        load_metadata(path)
    assert message in str(err.value)


def test_a_jdbc_source_cannot_declare_a_dated_layout(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("sources:\n  - {source_id: s, kind: jdbc, jdbc_url: 'jdbc:postgresql://h/db', table: t,\n"
                    "     dated_layout: '{yyyy}/{mm}/{dd}'}\n")
    with pytest.raises(MetadataError, match="apply to files and s3 sources, not jdbc"):
        load_metadata(path)


def test_path_values_and_day_prefixes():
    from lakehouse.metadata.model import Source

    src = Source(source_id="s", kind="s3", format="parquet", bucket="b", prefix="in/daily",
                 dated_layout="dt={yyyy}-{mm}-{dd}")
    assert dated.s3_day_prefix(src, dt.date(2025, 1, 2)) == "in/daily/dt=2025-01-02/"
    assert dated.key_in_day(src, "in/daily/dt=2025-01-02/x.parquet", dt.date(2025, 1, 2))
    assert not dated.key_in_day(src, "in/daily/dt=2025-01-022/x.parquet", dt.date(2025, 1, 2))
    assert dated.path_value("in/dt=2025-01-02/x.parquet", "dt") == "2025-01-02"
    assert dated.typed_value("2025-01-02", "date") == dt.date(2025, 1, 2)
    assert dated.typed_value("x1", "int") is None and dated.path_value("a/b.parquet", "dt") is None
    assert pa.array([dated.typed_value("7", "int")], pa.int32()).to_pylist() == [7]
