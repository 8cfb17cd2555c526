"""Every metadata mistake of issue 17 is caught by `metadata validate` (no Spark), with the file
(the .sql file and line for SQL), the key path and the fix — and neither `validate` nor a
rejected `apply` changes anything: the control DB keeps its rows, an empty LAKEHOUSE_HOME stays empty.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from lakehouse.cli import main as cli
from lakehouse.metadata.checks import check_stages, unchecked
from lakehouse.metadata.derive import StageColumns, derive_columns
from lakehouse.metadata.loader import MetadataError, load_metadata
from tests.conftest import seed_control_db

DEMO = Path(__file__).resolve().parent.parent / "metadata" / "demo"

SHOP = """
pipelines:
  - {pipeline_id: shop, default_retry_id: r}
retry_policies:
  - {retry_id: r, max_retries: 3, delay_seconds: 1}
sources:
  - source_id: orders_raw
    kind: files
    format: csv
    path: orders
    columns:
      - {name: order_id, type: bigint}
      - {name: customer_id, type: bigint}
      - {name: amount, type: "decimal(10,2)"}
      - {name: order_ts, type: timestamp}
  - {source_id: customers_db, kind: jdbc, jdbc_url: "jdbc:postgresql://localhost/shop", table: customers,
     load_type: incremental, primary_key: [customer_id], watermark_column: updated_at}
targets:
  - {target_id: bronze_orders, namespace: bronze, table: orders}
  - {target_id: bronze_customers, namespace: bronze, table: customers, write_mode: merge, merge_keys: [customer_id]}
  - {target_id: silver_orders, namespace: silver, table: orders, write_mode: merge, merge_keys: [order_id],
     partition_spec: [{column: order_day, transform: identity}], sort_order: [{column: customer_id}]}
  - {target_id: gold_sales, namespace: gold, table: sales, write_mode: overwrite}
stages:
  - {pipeline_id: shop, stage_order: 1, stage_name: ingest_orders, layer: bronze, source_id: orders_raw,
     target_id: bronze_orders}
  - {pipeline_id: shop, stage_order: 2, stage_name: ingest_customers, layer: bronze, source_id: customers_db,
     target_id: bronze_customers}
  - {pipeline_id: shop, stage_order: 3, stage_name: clean_orders, layer: silver, target_id: silver_orders,
     transformation_file: sql/silver_orders.sql, validation_set_id: silver_rules}
  - {pipeline_id: shop, stage_order: 4, stage_name: sales, layer: gold, target_id: gold_sales,
     transformation: "SELECT order_day, sum(amount) AS revenue FROM silver.orders GROUP BY order_day",
     validation_set_id: gold_rules}
validation_rules:
  - rule_set_id: silver_rules
    rules:
      - {name: ts_present, type: not_null, columns: [order_day]}
      - {name: positive, type: expression, expression: "amount > 0"}
  - rule_set_id: gold_rules
    rules:
      - {name: revenue_ok, type: range, column: revenue, min: 0}
"""

SILVER_SQL = """-- clean orders
SELECT order_id, customer_id, amount,
       CAST(order_ts AS DATE) AS order_day
FROM bronze.orders
WHERE amount > 0
"""


def shop(tmp_path: Path, text: str = SHOP, sql: str = SILVER_SQL) -> Path:
    d = tmp_path / "meta"
    (d / "sql").mkdir(parents=True, exist_ok=True)
    (d / "shop.yaml").write_text(textwrap.dedent(text))
    (d / "sql" / "silver_orders.sql").write_text(sql)
    return d


def problems_of(path: Path, **kw) -> list[str]:
    with pytest.raises(MetadataError) as exc:
        load_metadata(path, **kw)
    return exc.value.problems


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty LAKEHOUSE_HOME with the embedded defaults (control DB, catalog) inside it."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("LAKEHOUSE_HOME", str(h))
    for v in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME",
              "DAGSTER_HOME"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("LAKEHOUSE_DAGSTER_EPHEMERAL", "1")  # apply needs no Dagster instance here
    return h


def control_rows(home: Path) -> dict[str, list]:
    engine = sa.create_engine(f"sqlite:///{home / 'control.db'}")
    with engine.connect() as conn:
        out = {t: sorted(map(tuple, conn.execute(sa.text(f"SELECT * FROM {t}")).fetchall()), key=repr)
               for t in ("pipelines", "stages", "targets", "validation_rules", "sources")}
    engine.dispose()
    return out


def rejected_everywhere(home: Path, meta: Path, capsys) -> str:
    """validate and apply both refuse `meta`; the control DB holds exactly what it held before."""
    before = control_rows(home)
    assert cli(["metadata", "validate", str(meta)]) == 2
    err = capsys.readouterr().err
    assert cli(["metadata", "apply", str(meta)]) == 2
    assert capsys.readouterr().err == err
    assert control_rows(home) == before
    return err


@pytest.fixture
def applied(home, tmp_path, capsys, control_db_at_head) -> Path:
    """The valid shop metadata, applied (to a control DB at the newest revision): the control DB the
    rejected changes must leave alone."""
    seed_control_db(control_db_at_head, home)
    meta = shop(tmp_path)
    assert cli(["metadata", "validate", str(meta)]) == 0
    assert cli(["metadata", "apply", str(meta)]) == 0
    capsys.readouterr()
    return meta


def test_valid_shop_and_demo_pass(tmp_path):
    load_metadata(shop(tmp_path))
    load_metadata(DEMO)


def test_rule_on_a_column_the_dataset_lacks(home, applied, capsys):
    (applied / "shop.yaml").write_text(SHOP.replace("columns: [order_day]", "columns: [order_timestamp]"))
    err = rejected_everywhere(home, applied, capsys)
    assert (f"{applied / 'shop.yaml'}: validation_rules[0].rules[0]: rule 'ts_present' (stage shop.clean_orders) "
            "checks column(s) ['order_timestamp'], which silver.orders does not have (its columns: order_id, "
            "customer_id, amount, order_day, from its SQL). Fix: use one of those columns") in err


def test_incremental_jdbc_source_on_an_append_target(home, applied, capsys):
    (applied / "shop.yaml").write_text(SHOP.replace(
        "table: customers, write_mode: merge, merge_keys: [customer_id]}", "table: customers}"))
    err = rejected_everywhere(home, applied, capsys)
    assert (f"{applied / 'shop.yaml'}: targets[1].write_mode: source 'customers_db' is an incremental JDBC load but "
            "target 'bronze_customers' has write_mode 'append'") in err
    assert "Fix: set write_mode: merge and merge_keys: ['customer_id']" in err


def test_full_jdbc_load_needs_overwrite_and_merge_keys_must_match(tmp_path):
    full = SHOP.replace("load_type: incremental, ", "").replace(
        "table: customers, write_mode: merge, merge_keys: [customer_id]}", "table: customers}")
    (msg,) = problems_of(shop(tmp_path, full))
    assert "targets[1].write_mode: source 'customers_db' is a full JDBC load" in msg and "write_mode: overwrite" in msg
    keys = SHOP.replace("merge_keys: [customer_id]}", "merge_keys: [id]}")
    (msg,) = problems_of(shop(tmp_path, keys))
    assert "targets[1].merge_keys: target 'bronze_customers' merges on ['id'] but its incremental source" in msg


def test_expression_rule_with_two_statements_or_unknown_columns(home, applied, capsys):
    (applied / "shop.yaml").write_text(SHOP.replace('"amount > 0"', '"amount > 0; DROP TABLE silver.orders"'))
    err = rejected_everywhere(home, applied, capsys)
    assert ("validation_rules[0].rules[1]: rule 'positive' (stage shop.clean_orders) expression 'amount > 0; DROP "
            "TABLE silver.orders' must be one expression, found 2 statements. Fix: write one Spark SQL boolean") in err
    (applied / "shop.yaml").write_text(SHOP.replace('"amount > 0"', '"amout > 0 AND customer_id IS NOT NULL"'))
    err = rejected_everywhere(home, applied, capsys)
    assert "expression 'amout > 0 AND customer_id IS NOT NULL' uses column(s) ['amout'], which the dataset" in err


def test_drop_table_as_stage_sql_names_the_sql_file_and_line(home, applied, capsys):
    (applied / "sql" / "silver_orders.sql").write_text("-- oops\n\nDROP TABLE silver.orders\n")
    err = rejected_everywhere(home, applied, capsys)
    sql = applied / "sql" / "silver_orders.sql"
    assert (f"{sql}:3:1 (stage shop.clean_orders, {applied / 'shop.yaml'}: stages[2].transformation_file): the "
            "stage's SQL is a DROP statement, not a query; a stage's SQL must be one SELECT") in err
    (applied / "shop.yaml").write_text(SHOP.replace('"SELECT order_day, sum(amount)', '"SELECT 1 AS x; SELECT order_day, sum(amount)'))
    (applied / "sql" / "silver_orders.sql").write_text(SILVER_SQL)
    err = rejected_everywhere(home, applied, capsys)
    assert "stages[3].transformation: the stage's SQL holds 2 statements (SELECT, SELECT)" in err


def test_absolute_transformation_file_is_refused_and_never_stored(home, applied, capsys):
    secret = applied.parent / "secret.sql"
    secret.write_text("SELECT 'not for the control DB' AS s")
    (applied / "shop.yaml").write_text(SHOP.replace("sql/silver_orders.sql", str(secret)))
    err = rejected_everywhere(home, applied, capsys)
    assert (f"{applied / 'shop.yaml'}: stages[2].transformation_file: '{secret}' is an absolute path; "
            "transformation_file must be a path relative to the metadata file") in err
    assert "not for the control DB" not in json.dumps(control_rows(home), default=str)
    (applied / "shop.yaml").write_text(SHOP.replace("sql/silver_orders.sql", "/etc/hostname"))
    assert "'/etc/hostname' is an absolute path" in rejected_everywhere(home, applied, capsys)


def test_dotdot_and_symlink_escapes_are_refused(home, applied, capsys):
    outside = applied.parent / "outside.sql"
    outside.write_text("SELECT order_day, 1 AS revenue FROM silver.orders")
    (applied / "shop.yaml").write_text(SHOP.replace("sql/silver_orders.sql", "../outside.sql"))
    err = rejected_everywhere(home, applied, capsys)
    assert f"stages[2].transformation_file: '../outside.sql' leads outside the metadata directory {applied}" in err
    (applied / "sql" / "link.sql").symlink_to(outside)
    (applied / "shop.yaml").write_text(SHOP.replace("sql/silver_orders.sql", "sql/link.sql"))
    err = rejected_everywhere(home, applied, capsys)
    assert "'sql/link.sql' leads through a symlink outside the metadata directory" in err
    # a path that goes out and comes back in is fine; a non-.sql file is not
    (applied / "shop.yaml").write_text(SHOP.replace("sql/silver_orders.sql", "../meta/sql/silver_orders.sql"))
    load_metadata(applied)
    (applied / "shop.yaml").write_text(SHOP.replace("sql/silver_orders.sql", "shop.yaml"))
    assert "'shop.yaml' is not a .sql file" in rejected_everywhere(home, applied, capsys)


def test_sql_syntax_error_names_the_sql_file_line_in_plain_words(tmp_path):
    meta = shop(tmp_path, sql="-- clean orders\nSELECT order_id,\n  amount FROM bronze.orders WHERE (amount > 0\n")
    (msg,) = problems_of(meta)
    assert msg.startswith(f"{meta / 'sql' / 'silver_orders.sql'}:3:") and "stages[2].transformation_file" in msg
    assert "a parenthesis is not closed" in msg
    assert "sqlglot" not in msg and "<class" not in msg and "Required keyword" not in msg
    (msg,) = problems_of(shop(tmp_path, sql="SELECT order_id FROM bronze.orders WHERE\n"))
    assert "incomplete SQL: something is missing after 'WHERE'" in msg and "<class" not in msg


def test_sql_reading_a_column_no_upstream_has(tmp_path):
    meta = shop(tmp_path, sql=SILVER_SQL.replace("customer_id, amount", "customer_id, amount, discount"))
    (msg,) = problems_of(meta)
    assert msg.startswith(f"{meta / 'sql' / 'silver_orders.sql'}:2:")
    assert "reads column 'discount', which none of its tables has (bronze.orders: order_id, customer_id" in msg


def test_target_merge_partition_and_sort_columns(tmp_path):
    text = SHOP.replace("merge_keys: [order_id]", "merge_keys: [order_key]").replace(
        "{column: order_day, transform: identity}", "{column: order_date, transform: day}").replace(
        "sort_order: [{column: customer_id}]", "sort_order: [{column: customer}]")
    probs = problems_of(shop(tmp_path, text))
    assert [p.split(": ", 2)[1] for p in probs] == ["targets[2].merge_keys[0]", "targets[2].partition_spec[0].column",
                                                     "targets[2].sort_order[0].column"]
    assert "partition_spec column 'order_date' is not a column of silver.orders" in probs[1]


def test_overwrite_partitions_needs_a_partition_spec(tmp_path):
    (msg,) = problems_of(shop(tmp_path, SHOP.replace("table: sales, write_mode: overwrite",
                                                      "table: sales, write_mode: overwrite_partitions")))
    assert "targets[3].write_mode: write_mode overwrite_partitions on gold.sales, which has no partition_spec" in msg


def test_cycle_names_the_files_and_unknown_source_lists_sources_only(tmp_path):
    text = SHOP.replace("FROM silver.orders GROUP BY", "FROM silver.orders JOIN gold.sales USING (order_day) GROUP BY")
    probs = problems_of(shop(tmp_path, text))
    assert any(p.startswith(f"{tmp_path / 'meta' / 'shop.yaml'}: stages[3]: cycle in dataflow: gold_sales -> "
                            "gold_sales") for p in probs), probs
    (msg,) = problems_of(shop(tmp_path, SHOP.replace("source_id: orders_raw,\n", "source_id: nope,\n")))
    assert "unknown source 'nope'; known sources: ['customers_db', 'orders_raw'] (to read another stage's" in msg
    assert "bronze_orders'" not in msg.split("known sources:")[1].split("(")[0]


def test_validate_writes_nothing_anywhere(home, tmp_path, capsys):
    meta = shop(tmp_path)
    assert cli(["metadata", "validate", str(meta)]) == 0
    (meta / "shop.yaml").write_text(SHOP.replace("columns: [order_day]", "columns: [nope]"))
    assert cli(["metadata", "validate", str(meta)]) == 2
    assert list(home.iterdir()) == []
    assert sorted(p.name for p in meta.rglob("*")) == ["shop.yaml", "silver_orders.sql", "sql"]


def test_columns_not_checkable_are_said_not_guessed(tmp_path, home, capsys):
    text = SHOP.replace("""    columns:
      - {name: order_id, type: bigint}
      - {name: customer_id, type: bigint}
      - {name: amount, type: "decimal(10,2)"}
      - {name: order_ts, type: timestamp}
""", "")
    meta = shop(tmp_path, text.replace("columns: [order_day]", "columns: [anything_goes]"))
    assert cli(["metadata", "validate", str(meta)]) == 0
    out = capsys.readouterr().out
    assert ("note: stage shop.ingest_orders: columns not checkable before a run: files source 'orders_raw' "
            "declares no columns") in out
    assert "note: stage shop.clean_orders: columns not checkable before a run: it reads bronze.orders" in out


def test_live_catalog_schema_is_used_when_the_table_exists(tmp_path):
    """With no declared columns, the existing table's columns decide; a run's planned stages follow the metadata."""
    text = SHOP.replace("""      - {name: amount, type: "decimal(10,2)"}
""", "")
    meta = shop(tmp_path, text)
    with pytest.raises(MetadataError):  # amount is no longer declared: the SQL reads a missing column
        load_metadata(meta)
    live = {"bronze.orders": {"order_id": "bigint", "customer_id": "bigint", "amount": "double",
                              "order_ts": "timestamp", "_source_file": "string", "_ingested_at": "timestamp"}}
    load_metadata(meta, live=live)  # the table has it (written before the column was dropped from the metadata)
    cat = load_metadata(shop(tmp_path)).catalog
    changed = {"silver.orders": {"order_id": "bigint", "total": "double"}}  # someone rewrote silver.orders
    probs = check_stages(cat, lambda s, k: f"{s}{list(k)}", lambda k: None, live=changed,
                         planned={"gold_sales"})  # a run of gold alone reads silver.orders as it is now
    assert [str(p) for p in probs if p.stage == ("shop", "sales")] == [
        "stages['shop', 4].transformation: the SQL at line 1, column 8 reads column 'order_day', which none of its tables has "
        "(silver.orders: order_id, total). Fix the SQL, or the upstream stage so it outputs 'order_day'"]


def test_derived_columns_are_plain_data(tmp_path):
    derived = derive_columns(load_metadata(shop(tmp_path)).catalog)
    assert derived["silver_orders"].columns == {"order_id": "bigint", "customer_id": "bigint",
                                                "amount": "decimal(10, 2)", "order_day": "date"}
    assert derived["gold_sales"].complete and list(derived["gold_sales"].columns) == ["order_day", "revenue"]
    assert derived["bronze_customers"].complete is False  # the database decides the rest
    assert derived["bronze_customers"].has("customer_id") and derived["bronze_customers"].has("email") is None
    text = json.dumps({k: v.to_dict() for k, v in derived.items()})
    assert {k: StageColumns.from_dict(v) for k, v in json.loads(text).items()} == derived
    assert unchecked(load_metadata(DEMO).catalog) == []


def test_configuration_errors_are_terminal():
    from lakehouse.control.retry import decide
    from lakehouse.errors import CONFIGURATION, ConfigurationError, classify
    from lakehouse.validation.rules import RuleError

    for exc in (ConfigurationError("rule on a missing column"), RuleError("rule 'x': column(s) ['y'] not in the "
                                                                            "dataset")):
        info = classify(exc)
        assert info.code == CONFIGURATION and not info.retryable
    cat = load_metadata(DEMO).catalog
    d = decide(cat, "user_events_etl", "silver_clean", 0, retryable=classify(ConfigurationError("x")).retryable)
    assert not d.retry and d.reason == "error is not retryable"


def test_static_checks_are_fast_enough_for_many_stages(tmp_path):
    """200 SQL stages validate in well under the fast lane's budget (derivation is per stage, no deep copies)."""
    import time

    lines = ["pipelines:\n  - {pipeline_id: p}", "sources:\n  - {source_id: s, kind: files, format: jsonl, path: x,"
             " columns: [{name: id, type: bigint}, {name: v, type: string}]}", "targets:",
             "  - {target_id: t0, namespace: bronze, table: t0}"]
    lines += [f"  - {{target_id: t{i}, namespace: silver, table: t{i}}}" for i in range(1, 201)]
    lines += ["stages:", "  - {pipeline_id: p, stage_order: 1, stage_name: s0, layer: bronze, source_id: s, "
              "target_id: t0}"]
    lines += [f"  - {{pipeline_id: p, stage_order: {i + 1}, stage_name: s{i}, layer: silver, target_id: t{i}, "
              f"transformation: \"SELECT id, upper(v) AS v FROM {'bronze' if i == 1 else 'silver'}.t{i - 1} WHERE id > 0\"}}"
              for i in range(1, 201)]
    f = tmp_path / "many.yaml"
    f.write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    derived = derive_columns(load_metadata(f).catalog)
    assert list(derived["t200"].columns) == ["id", "v"]
    print(f"200 chained SQL stages loaded and checked in {time.perf_counter() - t0:.2f}s")


def test_cli_never_creates_the_home_on_a_bad_path(home, capsys):
    assert cli(["metadata", "validate", str(home / "nope")]) == 2
    assert "no such metadata file or directory" in capsys.readouterr().err
    assert list(home.iterdir()) == [] and os.path.isdir(home)


def _python_stage(ref: str, inputs: str = "[silver.orders]") -> str:
    return SHOP.replace("validation_rules:", f"""  - {{pipeline_id: shop, stage_order: 5, stage_name: py, layer: gold, target_id: gold_py,
     transformation: {{python: "{ref}", inputs: {inputs}}}}}
validation_rules:""", 1).replace("targets:\n", "targets:\n  - {target_id: gold_py, namespace: gold, table: py}\n", 1)


def one_argument(inputs):
    """A valid Python transformation (only referenced, never called, by these checks)."""
    return inputs["silver.orders"]


def two_arguments(inputs, spark):
    return inputs["silver.orders"]


def test_python_transformation_reference_is_checked_before_any_run(tmp_path):
    load_metadata(shop(tmp_path, _python_stage("tests.test_static_checks:one_argument")))
    for ref, expected in (("tests.no_such_module:f", "module 'tests.no_such_module' does not import"),
                          ("tests.test_static_checks:missing", "has no 'missing'"),
                          ("tests.test_static_checks:SHOP", "is a str, not a function"),
                          ("tests.test_static_checks:two_arguments", "must take one argument")):
        (msg,) = problems_of(shop(tmp_path, _python_stage(ref)))
        assert "shop.yaml" in msg and "stages[4].transformation.python" in msg and expected in msg, msg
    (msg,) = problems_of(shop(tmp_path, _python_stage("tests.test_static_checks:one_argument", "[gold.nope]")))
    assert "stages[4].transformation.inputs[0]" in msg and "'gold.nope' is not the target" in msg
