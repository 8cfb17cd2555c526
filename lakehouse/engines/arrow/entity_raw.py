"""entity_raw loads without a JVM: the raw parquet rows to entity_raw rows with pyarrow (issue 21).

The common entity_raw load is a few records per workflow, for which a Spark start-up costs seconds
for milliseconds of work. When `lakehouse.engines.choice.choose_for_application` picks Arrow, the load
(lakehouse.stage.entity_raw.load) reads each file with pyarrow, builds `raw_record` with Spark's own
`to_json` spelling (lakehouse.engines.arrow.to_json), applies the size cap into the same quarantine table,
and hands the rows to the same write-audit-publish service on the Arrow engine: the same audit
branch, rules, kill switch, snapshot-summary checkpoints and exactly-once publish. A table either
engine loads is the same table, so they may load it turn and turn about.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse.engines.arrow.to_json import cast_string, to_json_rows
from lakehouse.stage.entity_raw_cap import (
    FILE_COLUMN,
    KEY,
    PROVENANCE,
    QUARANTINE_COLUMNS,
    ROW_COLUMN,
    quarantine_identifier,
)

if TYPE_CHECKING:
    from lakehouse.ingest.files import FileRef
    from lakehouse.platform import Platform
    from lakehouse.table.iceberg import CatalogTables

log = logging.getLogger(__name__)


def read_raw(files: list[FileRef]) -> list[pa.Table]:
    """Each file's rows as Spark reads them (one table per file, so files of other schemas keep
    their columns), plus the provenance columns (source path, row index in the file)."""
    import pyarrow.parquet as pq

    out = []
    for f in files:
        path = f.local_path or f.key
        t = pq.read_table(path, coerce_int96_timestamp_unit="us")
        # legacy INT96 timestamps are instants to Spark (TimestampType, UTC), zone-less to pyarrow
        int96 = {c.path for c in pq.ParquetFile(path).schema if c.physical_type == "INT96"}
        for i, name in enumerate(t.column_names):
            if name in int96 and pa.types.is_timestamp(t.schema.field(i).type):
                t = t.set_column(i, name, t.column(i).cast(pa.timestamp("us", tz="UTC")))
        clash = [c for c in PROVENANCE if c in t.column_names]
        if clash:
            raise ValueError(f"raw files have column(s) {clash}, names the entity_raw loader reserves")
        t = t.append_column(FILE_COLUMN, pa.repeat(pa.scalar(path, pa.string()), t.num_rows))
        out.append(t.append_column(ROW_COLUMN, pa.array(range(t.num_rows), pa.int64())))
    return out


def to_entity_raw(raw: pa.Table, *, typename: str, connection_qualified_name: str, workflow_id: str,
                  workflow_run_id: str, extracted_at: int, tenant_id: str, entity_name_field: str | None) -> pa.Table:
    """Raw rows -> entity_raw rows (+ provenance), the twin of lakehouse.stage.entity_raw.to_entity_raw."""
    cols = [c for c in raw.column_names if c not in PROVENANCE]
    n = raw.num_rows

    def lit(v, t=pa.string()):
        return pa.repeat(pa.scalar(v, t), n)

    name = (cast_string(raw.column(entity_name_field)) if entity_name_field and entity_name_field in cols
            else pa.nulls(n, pa.string()))
    return pa.table({"typename": lit(typename), "connection_qualified_name": lit(connection_qualified_name),
                     "workflow_id": lit(workflow_id), "workflow_run_id": lit(workflow_run_id),
                     "extracted_at": lit(int(extracted_at), pa.int64()), "tenant_id": lit(tenant_id),
                     "entity_name": name, "raw_record": to_json_rows(raw, cols),
                     FILE_COLUMN: raw.column(FILE_COLUMN), ROW_COLUMN: raw.column(ROW_COLUMN)})


def _quarantine_schema():
    from lakehouse.engines.types import UTC_US, arrow_to_iceberg

    types = {"string": pa.string(), "bigint": pa.int64(), "timestamp": UTC_US}
    return arrow_to_iceberg(pa.schema([(c, types[t]) for c, t in QUARANTINE_COLUMNS]))


def apply_cap(platform: Platform, identifier: str, table: pa.Table, files: list[FileRef], max_bytes: int,
              run_id: str) -> tuple[pa.Table, int]:
    """(the rows to load, without provenance; how many oversized records were quarantined): the
    twin of lakehouse.stage.entity_raw_cap.apply_cap, into the same table with the same columns."""
    size = pc.binary_length(table.column("raw_record").cast(pa.binary()))
    over_mask = pc.greater(size, max_bytes)
    keep = table.filter(pc.invert(over_mask)).drop_columns(list(PROVENANCE))
    over = table.filter(over_mask)
    if over.num_rows == 0:
        return keep, 0
    by_path = {f.local_path or f.key: f for f in files}
    refs = [by_path.get(p) for p in over.column(FILE_COLUMN).to_pylist()]
    n = over.num_rows
    rows = pa.table({
        **{c: over.column(c) for c, _ in QUARANTINE_COLUMNS[:8]},
        "file_key": pa.array([r.key if r else p for r, p in zip(refs, over.column(FILE_COLUMN).to_pylist(), strict=True)],
                             pa.string()),
        "file_etag": pa.array([r.etag if r else None for r in refs], pa.string()),
        "row_index": over.column(ROW_COLUMN).cast(pa.int64()),
        "record_bytes": pc.binary_length(over.column("raw_record").cast(pa.binary())).cast(pa.int64()),
        "max_record_bytes": pa.repeat(pa.scalar(int(max_bytes), pa.int64()), n),
        "reason": pa.repeat(pa.scalar(f"raw_record over max_record_bytes={max_bytes}"), n),
        "run_id": pa.repeat(pa.scalar(run_id), n),
        "quarantined_at": pa.repeat(pa.scalar(dt.datetime.now(dt.UTC), pa.timestamp("us", tz="UTC")), n),
    })
    written = write_quarantine(platform, identifier, rows, run_id)
    log.warning("%s: %d record(s) over %d bytes quarantined in %s", identifier, written, max_bytes,
                quarantine_identifier(identifier))
    return keep, written


def write_quarantine(platform: Platform, identifier: str, rows: pa.Table, run_id: str) -> int:
    """Append the oversized records not already quarantined (same key as the Spark twin)."""
    from pyiceberg.exceptions import TableAlreadyExistsError

    cat = platform.pyiceberg_catalog()
    qident = quarantine_identifier(identifier)
    if not cat.table_exists(qident):
        try:
            cat.create_table(qident, schema=_quarantine_schema(), properties={
                "format-version": "2",
                "comment": "entity_raw records over the application max_record_bytes, kept whole with their key"})
        except TableAlreadyExistsError:
            pass
    table = cat.load_table(qident)
    existing = table.scan(selected_fields=KEY).to_arrow()
    seen = set(zip(*[existing.column(k).to_pylist() for k in KEY], strict=True)) if existing.num_rows else set()
    mask = pa.array([k not in seen for k in zip(*[rows.column(k).to_pylist() for k in KEY], strict=True)])
    new = rows.filter(mask)
    if new.num_rows:
        table.append(new.cast(table.schema().as_arrow()), snapshot_properties={"lakehouse.run_id": run_id})
    return rows.num_rows


def upsert_delete(ident: str, tenant_id: str, pairs: list[tuple[str, str]]) -> Callable[[CatalogTables, str], None]:
    """UPSERT on Arrow: on the audit branch, PyIceberg deletes the tenant's rows of every
    (connection_qualified_name, typename) the load contains (the expression is built from values,
    never text), before the new rows; both reach main in one publish."""
    from functools import reduce

    from pyiceberg.expressions import And, EqualTo, Or

    each = [And(EqualTo("connection_qualified_name", c), EqualTo("typename", t)) for c, t in pairs]
    cond = And(EqualTo("tenant_id", tenant_id), reduce(Or, each))

    def delete(tables: CatalogTables, branch: str) -> None:
        tables.meta.load_table(ident).delete(cond, branch=branch)
    return delete
