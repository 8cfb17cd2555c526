"""Shared helpers of the validation / write-audit-publish / quarantine tests (not a test module)."""

from __future__ import annotations

import io
import textwrap
from contextlib import redirect_stdout
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata

ORDER_SCHEMA = pa.schema([
    ("order_id", pa.int64()), ("customer_id", pa.int64()), ("amount", pa.float64()),
    ("status", pa.string()), ("email", pa.string()), ("order_ts", pa.timestamp("us", tz="UTC")),
])

BASE = """
pipelines:
  - {pipeline_id: customers_etl}
  - {pipeline_id: orders_etl}
sources:
  - {source_id: customers_raw, kind: files, format: parquet, path: customers, glob: "*.parquet"}
  - {source_id: orders_raw, kind: files, format: parquet, path: orders, glob: "*.parquet"}
targets:
  - {target_id: bronze_customers, namespace: bronze, table: customers}
  - {target_id: bronze_orders, namespace: bronze, table: orders}
  - {target_id: silver_orders, namespace: silver, table: orders, write_mode: overwrite}
stages:
  - {pipeline_id: customers_etl, stage_order: 1, stage_name: customers, layer: bronze, source_id: customers_raw,
     target_id: bronze_customers}
  - {pipeline_id: orders_etl, stage_order: 1, stage_name: ingest, layer: bronze, source_id: orders_raw,
     target_id: bronze_orders, validation_set_id: order_rules}
  - {pipeline_id: orders_etl, stage_order: 2, stage_name: clean, layer: silver, target_id: silver_orders,
     transformation: "SELECT order_id, customer_id, amount FROM bronze.orders"}
"""


def apply(platform, tmp_path: Path, rules_yaml: str, base: str = BASE) -> None:
    """Apply the base pipelines plus the `order_rules` rule set given as YAML rule list items."""
    text = base + "validation_rules:\n  - rule_set_id: order_rules\n    rules:\n" + textwrap.indent(
        textwrap.dedent(rules_yaml).strip(), "      ") + "\n"
    path = tmp_path / "meta.yaml"
    path.write_text(text)
    platform.store.apply(load_metadata(path))


def order(order_id, customer_id=1, amount=10.0, status="paid", email="a@b.example", age_s=60, **extra) -> dict:
    """An order `age_s` old when it is made (not when the module was imported: a slow suite must not age it)."""
    now = datetime.now(UTC).replace(microsecond=0)
    return {"order_id": order_id, "customer_id": customer_id, "amount": amount, "status": status, "email": email,
            "order_ts": now - timedelta(seconds=age_s), **extra}


def land(platform, folder: str, name: str, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    out = platform.settings.landing_dir / folder
    out.mkdir(parents=True, exist_ok=True)
    if schema is None:
        schema = ORDER_SCHEMA
        extra = [k for k in rows[0] if k not in schema.names]
        for k in extra:
            schema = schema.append(pa.field(k, pa.string()))
    table = pa.Table.from_pylist(rows, schema=schema)
    path = out / f"{name}.parquet"
    pq.write_table(table, path)
    return path


def land_customers(platform, ids=(1, 2, 3)) -> None:
    land(platform, "customers", "c1", [{"customer_id": i, "name": f"c{i}"} for i in ids],
         pa.schema([("customer_id", pa.int64()), ("name", pa.string())]))


def definitions(platform) -> dg.Definitions:
    from lakehouse_assets.definitions import build_definitions

    return build_definitions(platform)


def run(platform, pipeline_id: str = "orders_etl"):
    from lakehouse_assets.definitions import pipeline_job

    job = pipeline_job(definitions(platform), pipeline_id)
    return job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def checks(result) -> dict:
    """check name -> AssetCheckEvaluation of the orders table."""
    return {c.check_name: c for c in result.get_asset_check_evaluations()
            if c.asset_key == dg.AssetKey(["bronze", "orders"])}


def md(evaluation) -> dict:
    return {k: getattr(v, "value", v) for k, v in evaluation.metadata.items()}


def materialized(result) -> set[str]:
    return {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}


def pyiceberg(platform) -> SqlCatalog:
    s = platform.settings
    return SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)


def main_snapshot(platform, ident: str) -> int | None:
    snap = pyiceberg(platform).load_table(ident).current_snapshot()
    return snap.snapshot_id if snap else None


def rows_of(platform, ident: str, ref: str | None = None) -> list[dict]:
    table = pyiceberg(platform).load_table(ident)
    scan = table.scan() if ref is None else table.scan(snapshot_id=table.metadata.refs[ref].snapshot_id)
    return scan.to_arrow().to_pylist()


def cli(*argv: str) -> tuple[int, str]:
    from lakehouse.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(list(argv))
    return rc, buf.getvalue()
