"""Static checks at `metadata validate` (issue 40 item 4): hostile SQL, identifiers and types are refused
when the metadata is loaded, each naming the file, the entry and the field, instead of failing a run
(a failed merge stage left an empty table and a dead branch).

* DuckDB SQL (a `sql_engine: duckdb` stage, an expression rule the Arrow engine evaluates) that
  reads files, URLs, other databases, extensions or settings: refused by the check the run uses
  (`lakehouse.sql.parse.external_access`, inside `to_duckdb` / `expression_to_duckdb`);
* merge keys, rule columns and declared column names that carry a quote, ';', a comment marker or a
  control character; declared types that are not one Spark SQL type (the ingestion's own grammar,
  `lakehouse.metadata.spark_types`);
* what is valid stays valid: the repository's metadata, names with spaces and parentheses, types only
  Spark's parser knows.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.model import ColumnSpec, Rule, Target
from lakehouse.sources.duckdb_sql import query_arrow
from lakehouse.sql.parse import DuckdbSqlError, duckdb_problem, expression_problem

REPO = Path(__file__).resolve().parent.parent

GOLD_SQL = "SELECT country, COUNT(*) AS orders, SUM(amount) AS total FROM bronze.sales GROUP BY country"

BASE = {
    "pipelines": [{"pipeline_id": "sales"}],
    "sources": [{"source_id": "sales_raw", "kind": "files", "format": "jsonl", "path": "sales", "glob": "*.jsonl",
                 "columns": [{"name": "id", "type": "bigint"}, {"name": "country", "type": "string"},
                             {"name": "amount", "type": "double"}]}],
    "targets": [
        {"target_id": "bronze_sales", "namespace": "bronze", "table": "sales", "write_mode": "merge",
         "merge_keys": ["id"]},
        {"target_id": "gold_by_country", "namespace": "gold", "table": "sales_by_country", "write_mode": "overwrite",
         "engine": "arrow"}],
    "stages": [
        {"pipeline_id": "sales", "stage_order": 1, "stage_name": "ingest", "layer": "bronze", "source_id": "sales_raw",
         "target_id": "bronze_sales", "validation_set_id": "bronze_rules"},
        {"pipeline_id": "sales", "stage_order": 2, "stage_name": "by_country", "layer": "gold",
         "target_id": "gold_by_country", "sql_engine": "duckdb", "validation_set_id": "gold_rules",
         "transformation": GOLD_SQL}],
    "validation_rules": [
        {"rule_set_id": "bronze_rules", "rules": [
            {"name": "present", "type": "not_null", "columns": ["id"]},
            {"name": "known", "type": "accepted_values", "column": "country", "values": ["de", "fr"]},
            {"name": "one_row", "type": "unique", "columns": ["id"]},
            {"name": "contract", "type": "schema_contract", "expected_columns": [
                {"name": "id", "type": "bigint"}, {"name": "country", "type": "string"},
                {"name": "amount", "type": "double"}]}]},
        {"rule_set_id": "gold_rules", "rules": [
            {"name": "positive", "type": "expression", "expression": "orders > 0"}]}],
}


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "meta.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def with_value(where: str, value) -> dict:
    """BASE with the field at `where` (e.g. `targets[0].merge_keys[0]`) set to `value`."""
    doc = copy.deepcopy(BASE)
    node = doc
    parts = where.replace("]", "").replace("[", ".").split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    node[int(last) if last.isdigit() else last] = value
    return doc


def test_the_base_and_the_repositorys_metadata_are_valid(tmp_path):
    loaded = load_metadata(write(tmp_path, BASE))
    assert [s.stage_name for s in loaded.catalog.stages] == ["ingest", "by_country"]
    for meta in sorted((REPO / "metadata").iterdir()):
        assert load_metadata(meta).catalog.pipelines, meta


HOSTILE_NAMES = ["id) OR 1=1 --", "id; DROP TABLE bronze.sales", "id`", "id` OR `1", "a'b", 'a"b', "a\\b",
                 "a\nb", "a\x00b", "a/*b", "a*/b", "", " id", "id ", "x" * 256]

NAME_FIELDS = [
    ("targets[0].merge_keys[0]", "targets[0].merge_keys", "merge_keys[0]"),
    ("validation_rules[0].rules[0].columns[0]", "validation_rules[0].rules[0].columns", "columns[0]"),
    ("validation_rules[0].rules[1].column", "validation_rules[0].rules[1].column", "column"),
    ("validation_rules[0].rules[2].columns[0]", "validation_rules[0].rules[2].columns", "columns[0]"),
    ("sources[0].columns[1].name", "sources[0].columns[1].name", "column name"),
    ("validation_rules[0].rules[3].expected_columns[0].name", "validation_rules[0].rules[3].expected_columns[0].name",
     "column name"),
]


@pytest.mark.parametrize("field,loc,what", NAME_FIELDS, ids=[f[0] for f in NAME_FIELDS])
@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_a_hostile_column_name_is_refused_naming_file_entry_and_field(tmp_path, field, loc, what, name):
    path = write(tmp_path, with_value(field, name))
    with pytest.raises(MetadataError) as exc:
        load_metadata(path)
    mine = [p for p in exc.value.problems if p.startswith(f"{path}: {loc}: ")]
    assert mine, exc.value.problems
    assert f"{what} {name!r} is not a column name" in mine[0], mine


def test_a_referential_integrity_rules_ref_columns_are_checked_too():
    with pytest.raises(ValueError, match=r"ref_columns\[0\] 'id\) OR 1=1 --' is not a column name"):
        Rule(name="ri", type="referential_integrity", columns=["id"], ref_dataset="x", ref_columns=["id) OR 1=1 --"])


HOSTILE_TYPES = ["string) ; DROP TABLE bronze.sales", "string --", "string /* x */", "int int", "foo", "array<int",
                 "struct<a:int>>", "bigint, x int", "int) AS x, (1", "string`", "string'", "", "decimal(10,2); --"]
TYPE_FIELDS = ["sources[0].columns[1].type", "validation_rules[0].rules[3].expected_columns[0].type"]


@pytest.mark.parametrize("field", TYPE_FIELDS)
@pytest.mark.parametrize("type_", HOSTILE_TYPES, ids=repr)
def test_a_type_that_is_not_one_spark_type_is_refused_naming_the_field(tmp_path, field, type_):
    path = write(tmp_path, with_value(field, type_))
    with pytest.raises(MetadataError) as exc:
        load_metadata(path)
    mine = [p for p in exc.value.problems if p.startswith(f"{path}: {field}: ")]
    assert mine and f"cannot parse type {type_!r}" in mine[0], exc.value.problems


HOSTILE_SQL = {
    "read_csv": "SELECT country, COUNT(*) AS orders FROM bronze.sales, read_csv('/etc/passwd') AS p GROUP BY country",
    "read_parquet": "SELECT * FROM read_parquet('https://example.com/x.parquet')",
    "read_json_auto": "SELECT * FROM read_json_auto('/etc/hosts')",
    "read_ndjson": "SELECT * FROM read_ndjson('s3://bucket/x')",
    "read_text": "SELECT content AS c FROM read_text('/etc/passwd')",
    "read_blob": "SELECT content AS c FROM read_blob('/etc/shadow')",
    "parquet_scan": "SELECT * FROM parquet_scan('/x.parquet')",
    "parquet_metadata": "SELECT * FROM parquet_metadata('/x.parquet')",
    "sniff_csv": "SELECT * FROM sniff_csv('/etc/passwd')",
    "iceberg_scan": "SELECT * FROM iceberg_scan('/warehouse/t')",
    "sqlite_scan": "SELECT * FROM sqlite_scan('/home/control.db', 'pipelines')",
    "postgres_scan": "SELECT * FROM postgres_scan('host=db', 'public', 't')",
    "duckdb_settings": "SELECT * FROM duckdb_settings()",
    "duckdb_extensions": "SELECT * FROM duckdb_extensions()",
    "duckdb_secrets": "SELECT * FROM duckdb_secrets()",
    "pragma_version": "SELECT * FROM pragma_version()",
    "current_setting": "SELECT current_setting('home_directory') AS h FROM bronze.sales",
    "getenv": "SELECT getenv('HOME') AS h FROM bronze.sales",
    "which_secret": "SELECT which_secret('s3://b/x', 's3') AS s FROM bronze.sales",
    "query": "SELECT * FROM query('SELECT 1')",
    "json_each": "SELECT * FROM json_each('{}')",
    "in a subquery": "SELECT country FROM bronze.sales WHERE country IN (SELECT * FROM read_csv('/etc/passwd'))",
    "in a CTE": "WITH p AS (SELECT * FROM read_csv_auto('/etc/passwd')) SELECT * FROM p",
    "a file as a table": "SELECT * FROM 'data.csv'",
    "a path as a table": "SELECT * FROM parquet.`/tmp/x.parquet`",
}


@pytest.mark.parametrize("case", list(HOSTILE_SQL), ids=list(HOSTILE_SQL))
def test_duckdb_sql_that_reads_outside_its_tables_is_refused_at_validate(tmp_path, case):
    sql = HOSTILE_SQL[case]
    path = write(tmp_path, with_value("stages[1].transformation", sql))
    with pytest.raises(MetadataError) as exc:
        load_metadata(path)
    mine = [p for p in exc.value.problems if p.startswith(f"{path}: stages[1].sql_engine: ")]
    assert mine, exc.value.problems
    assert "SQL that DuckDB runs reads lake tables" in mine[0], mine
    # the run uses the same check before DuckDB sees the SQL (which has no external access either)
    with pytest.raises(DuckdbSqlError, match="SQL that DuckDB runs reads lake tables"):
        query_arrow(sql, {})


@pytest.mark.parametrize("sql", ["ATTACH '/tmp/x.db' AS x", "COPY (SELECT 1) TO '/tmp/x.csv'", "INSTALL httpfs",
                                 "LOAD httpfs", "SET enable_external_access = true", "PRAGMA version",
                                 "SELECT 1 AS a; SELECT * FROM read_csv('/etc/passwd')"])
def test_a_statement_that_is_not_one_query_is_refused_at_validate_and_at_run(tmp_path, sql):
    path = write(tmp_path, with_value("stages[1].transformation", sql))
    with pytest.raises(MetadataError) as exc:
        load_metadata(path)
    assert any(p.startswith(f"{path}: stages[1]") for p in exc.value.problems), exc.value.problems
    assert duckdb_problem(sql)


@pytest.mark.parametrize("expression", ["read_text('/etc/passwd') IS NOT NULL", "getenv('HOME') = 'x'",
                                        "current_setting('threads') = '1'",
                                        "orders IN (SELECT * FROM read_csv('/etc/passwd'))"])
def test_an_arrow_rule_that_reads_outside_the_rows_is_refused_at_validate(tmp_path, expression):
    path = write(tmp_path, with_value("validation_rules[1].rules[0].expression", expression))
    with pytest.raises(MetadataError) as exc:
        load_metadata(path)
    assert any(p.startswith(f"{path}: ") and "rule 'positive'" in p for p in exc.value.problems), \
        exc.value.problems
    assert expression_problem(expression) or "(SELECT" in expression  # a subquery is refused before DuckDB


@pytest.mark.parametrize("name", ["Amount (USD)", "order id", "größe", "a,b=c", "{x}", "2024_total", "size.cm",
                                  "a-b", "select"])
def test_names_databases_and_files_carry_stay_valid(name):
    assert Target(target_id="t", namespace="n", table="t", write_mode="merge", merge_keys=[name]).merge_keys == [name]
    assert Rule(name="r", type="not_null", columns=[name]).columns == [name]
    assert ColumnSpec(name=name, type="string").name == name


@pytest.mark.parametrize("type_", ["bigint", "DECIMAL(10, 2)", "varchar(5)", "array<struct<a:int,`b c`:map<string,double>>>",
                                   "timestamp_ntz", "struct<a int>", "interval day", "map<string, array<bigint>>"])
def test_types_spark_reads_stay_valid(type_):
    assert ColumnSpec(name="c", type=type_).type == type_


def test_valid_duckdb_sql_still_passes():
    assert duckdb_problem(GOLD_SQL) is None
    assert "reads lake tables" not in (duckdb_problem("SELECT * FROM range(3)") or "")
    assert duckdb_problem((REPO / "metadata" / "demo" / "sql" / "gold_daily_user_events.sql").read_text()) is None


def test_apply_refuses_them_too_and_writes_nothing(tmp_path):
    from lakehouse.metadata.store import MetadataStore

    store = MetadataStore(f"sqlite:///{tmp_path / 'control.db'}")
    for field, value, where in [("stages[1].transformation", HOSTILE_SQL["read_csv"], "stages[1].sql_engine"),
                                ("targets[0].merge_keys[0]", "id) OR 1=1 --", "targets[0].merge_keys"),
                                ("sources[0].columns[1].type", "string) ; DROP TABLE x", "sources[0].columns[1].type")]:
        path = write(tmp_path, with_value(field, value))
        with pytest.raises(MetadataError) as exc:
            store.apply(load_metadata(path, check_refs=False))  # what `lakehouse metadata apply` does
        assert any(p.startswith(f"{path}: {where}") for p in exc.value.problems), exc.value.problems
    assert store.load().stages == []
