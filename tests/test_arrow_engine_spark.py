"""The Arrow engine against the Spark engine (slow: Spark writes one side).

* The same landed files (JSON lines with a nested struct and a promoted field, CSV with declared
  types, parquet), written once by each engine, give the same table read by PyIceberg's scan (rows,
  schema, partition spec, the platform's snapshot summary keys) and by DuckDB, which is neither writer.
* A table written alternately by both engines, by two processes lined up at their publish over
  the same files, holds every row exactly once (the exactly-once check is the service's, shared).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakehouse.metadata.loader import load_metadata
from lakehouse.stage.runner import StageRunner
from tests import concurrency_kit as kit
from tests.test_pipeline_e2e import duckdb_read
from tests.test_wap_helpers import pyiceberg

pytestmark = pytest.mark.slow

FORMATS = {
    "jsonl": "{source_id: src_jsonl, kind: files, format: jsonl, path: j, glob: '*.jsonl', "
             "promote_fields: [{path: extra.app, column: app}]}",
    "csv": "{source_id: src_csv, kind: files, format: csv, path: c, glob: '*.csv', "
           "columns: [{name: id, type: bigint}, {name: country, type: string}, {name: amount, type: 'decimal(10,2)'}, {name: ts, type: timestamp}]}",
    "parquet": "{source_id: src_parquet, kind: files, format: parquet, path: p, glob: '*.parquet'}",
}


def meta(fmt: str) -> str:
    targets, stages = [], []
    for engine in ("spark", "arrow"):
        targets.append(f"  - {{target_id: t_{engine}, namespace: cmp_{fmt}, table: by_{engine}, engine: {engine}, "
                       "partition_spec: [{column: country}]}")
        stages.append(f"  - {{pipeline_id: p_{engine}, stage_order: 1, stage_name: ingest, layer: bronze, "
                      f"source_id: src_{fmt}, target_id: t_{engine}, validation_set_id: rules}}")
    rules = ["{name: id_present, type: not_null, columns: [id], action: quarantine, severity: warn}",
             "{name: id_unique, type: unique, columns: [id]}",
             # expressions (Spark SQL; DuckDB on the Arrow side): the same rows fail on both engines,
             # NULL counting as failing: a CAST that fails, a division by zero, a comparison with NULL
             "{name: country_numeric, type: expression, expression: 'CAST(country AS DOUBLE) > 0', severity: warn}",
             "{name: id_ratio, type: expression, expression: 'id / (id - 2) >= 1 OR country = \"fr\"', severity: warn}",
             "{name: id_small, type: expression, expression: 'id < 5 AND length(country) = 2', severity: warn}"]
    return "\n".join(["pipelines: [{pipeline_id: p_spark}, {pipeline_id: p_arrow}]", "sources:", f"  - {FORMATS[fmt]}",
                      "targets:", *targets, "stages:", *stages, "validation_rules:", "  - rule_set_id: rules",
                      "    rules:", *(f"      - {r}" for r in rules)]) + "\n"


def land(platform, fmt: str) -> None:
    root = platform.settings.landing_dir / fmt[0]
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"id": i if i != 4 else None, "country": "de" if i % 2 else "fr", "amount": f"{i}.25",
             "ts": f"2026-01-0{1 + i % 3} 10:00:0{i % 10}", "extra": {"app": f"a{i % 2}", "n": i}} for i in range(1, 9)]
    if fmt == "jsonl":
        for k in (0, 1):
            (root / f"f{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[k * 4:(k + 1) * 4]))
        (root / "f2.jsonl").write_text(json.dumps({"id": 99, "country": "it", "amount": "1", "new_col": True}) + "\n")
    elif fmt == "csv":
        for k in (0, 1):
            lines = ["id,country,amount,ts"] + [f"{'' if r['id'] is None else r['id']},{r['country']},{r['amount']},{r['ts']}"
                                                for r in rows[k * 4:(k + 1) * 4]]
            (root / f"f{k}.csv").write_text("\n".join(lines) + "\n")
    else:
        for k in (0, 1):
            part = rows[k * 4:(k + 1) * 4]
            pq.write_table(pa.table({"id": pa.array([r["id"] for r in part], pa.int64()),
                                     "country": [r["country"] for r in part],
                                     "amount": pa.array([float(r["amount"]) for r in part]),
                                     "extra": [r["extra"] for r in part]}), root / f"f{k}.parquet")


def view(cat, ident: str) -> dict:
    t = cat.load_table(ident)
    rows = t.scan().to_arrow().drop_columns(["_ingested_at"]).to_pylist()
    summary = t.current_snapshot().summary
    props = {k: v for k, v in summary.additional_properties.items() if k.startswith("lakehouse.")}
    return {"schema": str(t.schema()), "spec": [(t.schema().find_column_name(f.source_id), str(f.transform), f.name)
                                                for f in t.spec().fields],
            "rows": sorted(rows, key=lambda r: (r["id"] is None, r["id"] or 0)),
            "summary_keys": sorted(props), "files": json.loads(props["lakehouse.files"]),
            "counts": {k: summary.additional_properties.get(k) for k in ("total-records", "total-data-files")}}


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_both_engines_write_the_same_table(platform, tmp_path, fmt):
    path = tmp_path / "meta.yaml"
    path.write_text(meta(fmt))
    platform.store.apply(load_metadata(path))
    land(platform, fmt)
    outcomes = {}
    for engine in ("spark", "arrow"):
        runner = StageRunner(platform, f"p_{engine}", "ingest", f"run_{engine}")
        outcomes[engine] = runner.load(runner.extract())
        assert outcomes[engine].published and outcomes[engine].extra["engine"] == engine
    cat = pyiceberg(platform)
    by_spark, by_arrow = view(cat, f"cmp_{fmt}.by_spark"), view(cat, f"cmp_{fmt}.by_arrow")
    for r in by_spark["rows"]:  # the file each row came from, as each engine names it: the same
        assert r["_source_file"].startswith("file:///"), r
    assert by_arrow == by_spark
    # and by a reader that is neither writer: DuckDB's iceberg extension over each table's metadata
    seen = [duckdb_read(cat.load_table(f"cmp_{fmt}.by_{e}").metadata_location.removeprefix("file://"),
                        "SELECT * EXCLUDE (_ingested_at) FROM {table} ORDER BY id NULLS LAST") for e in ("spark", "arrow")]
    assert seen[0] == seen[1] and len(seen[0]) == len(by_arrow["rows"])
    assert len(by_arrow["rows"]) == (8 if fmt == "jsonl" else 7)  # id 4 quarantined; jsonl's third file adds one
    q_spark, q_arrow = (view_quarantine(cat, f"cmp_{fmt}.by_{e}__quarantine") for e in ("spark", "arrow"))
    assert q_arrow == q_spark and len(q_arrow["rows"]) == 1
    checks = {e: [(c.rule.name, c.passed, c.failed_rows, c.total_rows, c.message) for c in o.checks]
              for e, o in outcomes.items()}
    assert checks["arrow"] == checks["spark"]


def view_quarantine(cat, ident: str) -> dict:
    t = cat.load_table(ident)
    rows = t.scan().to_arrow().drop_columns(["_ingested_at", "_quarantined_at", "_quarantine_id", "_run_id"])
    return {"schema": str(t.schema()), "rows": rows.to_pylist()}


CHILD = """
import sys
from lakehouse.engines import choice as engine
from lakehouse.platform import Platform
from lakehouse.stage.runner import StageRunner

forced = sys.argv[1]
# this process writes with the engine named on its command line, whatever the metadata says
engine.choose = lambda ctx, plan: engine.EngineChoice(forced, forced, "forced by the test")
platform = Platform.from_env()
runner = StageRunner(platform, "conc", "files", sys.argv[2])
out = runner.load(runner.extract())
print("OUTCOME", out.published, out.rows_written, out.skipped_reason, out.extra.get("engine"))
"""


@pytest.mark.timeout(900)
def test_alternating_engines_stay_exactly_once_under_concurrent_processes(tmp_path, lake_home, unique_ns):
    """Spark and Arrow processes over the same files, lined up at their first publish (claims off,
    so both wrote everything): one publishes, the other finds its files on main and writes nothing
    again; then the roles swap on new files. Counted with PyIceberg."""
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.metadata.store import MetadataStore

    home = tmp_path / "home"
    home.mkdir()
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": "lake", "LAKEHOUSE_WAREHOUSE": f"file://{home / 'wh'}",
           "LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
           "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}"}
    (tmp_path / "m.yaml").write_text(textwrap.dedent(f"""\
        pipelines: [{{pipeline_id: conc}}]
        sources:
          - {{source_id: conc_files, kind: files, format: jsonl, path: events, glob: "*.jsonl", batch_files: 2,
             columns: [{{name: id, type: string}}, {{name: v, type: bigint}}]}}
        targets: [{{target_id: conc_file_events, namespace: bronze_{unique_ns}, table: file_events}}]
        stages:
          - {{pipeline_id: conc, stage_order: 1, stage_name: files, layer: bronze, source_id: conc_files,
             target_id: conc_file_events, validation_set_id: conc_rules}}
        validation_rules:
          - rule_set_id: conc_rules
            rules: [{{name: id_present, type: not_null, columns: [id], severity: warn, action: quarantine}}]
        platform_settings: [{{setting_key: claims.enabled, setting_value: "false"}}]
        """))
    MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(tmp_path / "m.yaml"))
    expected = kit.Expected()
    for round_, engines in enumerate((("spark", "arrow"), ("arrow", "spark"))):
        kit.land_files(home / "landing" / "events", f"r{round_}", n_files=3, rows=5, expected=expected)
        pause = tmp_path / f"pause{round_}"
        pause.mkdir()
        run_env = kit.run_env(env, LAKEHOUSE_PAUSE_AT="before_publish", LAKEHOUSE_PAUSE_DIR=str(pause))
        procs = []
        for i, eng in enumerate(engines):
            log = tmp_path / f"r{round_}-{eng}.log"
            with log.open("w") as fh:
                procs.append((subprocess.Popen([sys.executable, "-c", CHILD, eng, f"r{round_}_{i}_{eng}"], env=run_env,
                                               stdout=fh, stderr=subprocess.STDOUT, start_new_session=True), log))
        try:
            kit.release_when_paused(pause, procs, timeout=600)
            results = kit.wait_runs(procs, timeout=600)
        finally:
            kit.kill_all(procs)
        for rc, out in results:
            assert rc == 0 and "OUTCOME True" in out, out[-4000:]
        assert sum("already loaded" in out for _, out in results) == 1, [o[-2000:] for _, o in results]
    cat = SqlCatalog("lake", uri=env["LAKEHOUSE_CATALOG_URI"], warehouse=env["LAKEHOUSE_WAREHOUSE"])
    ident = f"bronze_{unique_ns}.file_events"
    assert kit.counts(cat, ident, "id") == Counter(expected.files)
    assert kit.counts(cat, ident + "__quarantine", "v") == Counter(expected.quarantined)
    assert set(cat.load_table(ident).metadata.refs) == {"main"}


@pytest.mark.parametrize("text", ["foo", "array<int", "int int", "a: int, b: string", "struct<a:int", "int; drop table x"])
def test_a_declared_type_that_does_not_parse_is_named_with_a_session_up(spark, text):
    """With a session up, what the plain-Python grammar lacks goes to Spark's parser; a type neither
    parses is the same ValueError as without one (not Spark's ParseException), and a list of
    fields, which pyspark's parser would take for a struct, is not a column type either."""
    from lakehouse.ingest.prepare import _parse_type

    with pytest.raises(ValueError, match="cannot parse type"):
        _parse_type(text)


DUCK_META = """
pipelines: [{pipeline_id: duck}]
sources:
  - {source_id: sales_raw, kind: files, format: jsonl, path: sales, glob: "*.jsonl"}
targets:
  - {target_id: bronze_sales, namespace: duck, table: sales, engine: arrow}
  - {target_id: by_spark, namespace: duck, table: by_spark, write_mode: overwrite, engine: spark,
     partition_spec: [{column: country}]}
  - {target_id: by_arrow, namespace: duck, table: by_arrow, write_mode: overwrite, engine: arrow,
     partition_spec: [{column: country}]}
stages:
  - {pipeline_id: duck, stage_order: 1, stage_name: ingest, layer: bronze, source_id: sales_raw, target_id: bronze_sales}
  - {pipeline_id: duck, stage_order: 2, stage_name: g_spark, layer: gold, target_id: by_spark, sql_engine: duckdb,
     validation_set_id: rules, transformation: SQL}
  - {pipeline_id: duck, stage_order: 3, stage_name: g_arrow, layer: gold, target_id: by_arrow, sql_engine: duckdb,
     validation_set_id: rules, transformation: SQL}
validation_rules:
  - rule_set_id: rules
    rules:
      - {name: has_rows, type: row_count, min: 1}
      - {name: country_unique, type: unique, columns: [country]}
      - {name: total_positive, type: range, column: total, min: 0, severity: warn}
"""
DUCK_SQL = ('"SELECT country, COUNT(*) AS orders, SUM(amount) AS total, SUM(qty) AS qty, MAX(CAST(ts AS DATE)) AS last_day, '
            'MAX(ts) AS last_ts, COUNT(DISTINCT id) AS ids FROM duck.sales GROUP BY country"')


def test_a_duckdb_stage_written_by_either_engine_gives_the_same_table_and_they_take_turns(platform, tmp_path):
    """The same DuckDB SQL over the same upstream snapshot, its result written by Spark (as a
    DataFrame from Arrow) and by the Arrow engine (PyIceberg): the same table (rows, schema,
    partition spec, the platform's summary keys) and the same checks. Then the Arrow engine
    replaces the Spark-written table's rows (the engines take turns on one table)."""
    path = tmp_path / "meta.yaml"
    path.write_text(DUCK_META.replace("SQL", DUCK_SQL))
    platform.store.apply(load_metadata(path))
    root = platform.settings.landing_dir / "sales"
    root.mkdir(parents=True)
    rows = [{"id": i, "country": ("de", "fr", "it")[i % 3], "amount": i * 1.5, "qty": i,
             "ts": f"2026-01-{1 + i % 9:02d}T0{i % 10}:00:00Z"} for i in range(1, 31)]
    (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = StageRunner(platform, "duck", "ingest", "r0")
    assert runner.load(runner.extract()).published
    outcomes = {}
    for engine in ("spark", "arrow"):
        runner = StageRunner(platform, "duck", f"g_{engine}", f"run_{engine}")
        outcomes[engine] = runner.load(runner.extract())
        assert outcomes[engine].published and outcomes[engine].extra["engine"] == engine
        assert outcomes[engine].extra["sql_engine"] == "duckdb"
    cat = pyiceberg(platform)

    def seen(ident: str) -> dict:
        t = cat.load_table(ident)
        props = {k for k in t.current_snapshot().summary.additional_properties if k.startswith("lakehouse.")}
        return {"schema": str(t.schema()), "spec": [(t.schema().find_column_name(f.source_id), str(f.transform))
                                                    for f in t.spec().fields],
                "rows": sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r["country"]), "props": sorted(props)}

    by_spark, by_arrow = seen("duck.by_spark"), seen("duck.by_arrow")
    assert by_arrow == by_spark and len(by_arrow["rows"]) == 3
    assert {r["country"]: r["orders"] for r in by_arrow["rows"]} == {"de": 10, "fr": 10, "it": 10}
    checks = {e: [(c.rule.name, c.passed, c.failed_rows, c.total_rows) for c in o.checks] for e, o in outcomes.items()}
    assert checks["arrow"] == checks["spark"]

    # turn about: the Arrow engine replaces the rows of the table Spark wrote
    path.write_text(DUCK_META.replace("SQL", DUCK_SQL).replace("write_mode: overwrite, engine: spark",
                                                               "write_mode: overwrite, engine: arrow"))
    platform.store.apply(load_metadata(path))
    (root / "b.jsonl").write_text(json.dumps({"id": 99, "country": "it", "amount": 1.0, "qty": 1,
                                              "ts": "2026-02-01T00:00:00Z"}) + "\n")
    runner = StageRunner(platform, "duck", "ingest", "r1")
    assert runner.load(runner.extract()).published
    runner = StageRunner(platform, "duck", "g_spark", "run_turn")
    out = runner.load(runner.extract())
    assert out.published and out.extra["engine"] == "arrow"
    after = {r["country"]: r["orders"] for r in cat.load_table("duck.by_spark").scan().to_arrow().to_pylist()}
    assert after == {"de": 10, "fr": 10, "it": 11}
