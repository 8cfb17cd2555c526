"""Quarantine: rows failing a `quarantine` rule, kept next to the dataset with every rule they failed.

The quarantine table `<namespace>.<table>__quarantine` holds the input columns plus
`_failed_rules` (array of rule names), `_run_id`, `_quarantined_at` and `_quarantine_id`.
It is written on the run's audit branch and published with the data, so a failed audit
leaves both tables' `main` untouched and a re-run does not quarantine the same rows twice.
Each engine writes it (`lakehouse.engines.audited.QuarantineBranch`); `lakehouse.stage.quarantine_replay.replay` re-validates quarantined rows with the current rules and
moves the passing ones into the dataset through the same write-audit-publish path.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse.metadata.model import Target
from lakehouse.table.iceberg import quote
from lakehouse.validation.rules import FAILED_RULES_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.platform import Platform

log = logging.getLogger(__name__)

SUFFIX = "__quarantine"
META_COLUMNS = (FAILED_RULES_COLUMN, "_run_id", "_quarantined_at", "_quarantine_id")


def quarantine_identifier(identifier: str) -> str:
    ns, tbl = identifier.split(".", 1)
    return f"{ns}.{tbl}{SUFFIX}"


def quarantine_target(target: Target) -> Target:
    ns, tbl = quarantine_identifier(target.identifier).split(".", 1)
    return Target(target_id=f"{target.target_id}{SUFFIX}", namespace=ns, table=tbl, write_mode="append",
                  description=f"rows of {target.identifier} that failed a quarantine rule")


# --------------------------------------------------------------------------- inspection and replay
def resolve_dataset(platform: Platform, dataset: str) -> Target:
    """A dataset named by target_id or by identifier (namespace.table)."""
    catalog = platform.catalog()
    for t in catalog.targets:
        if t.target_id == dataset or (t.kind == "iceberg" and t.identifier.lower() == dataset.lower()):
            if t.kind != "iceberg":
                raise KeyError(f"dataset {dataset!r} is a {t.kind} target, not an Iceberg table")
            return t
    known = sorted(t.target_id for t in catalog.targets)
    raise KeyError(f"unknown dataset {dataset!r}; give a target_id or namespace.table, known: {known}")


def read_quarantine(platform: Platform, dataset: str) -> DataFrame | None:
    target = resolve_dataset(platform, dataset)
    tables = platform.tables()
    ident = quarantine_identifier(target.identifier)
    return tables.read(ident) if tables.exists(ident) else None


def summary(platform: Platform, dataset: str) -> list[dict[str, Any]]:
    """Quarantined rows per (rule, run): what `lakehouse quarantine show` prints first."""
    from pyspark.sql import functions as F

    q = read_quarantine(platform, dataset)
    if q is None:
        return []
    rows = (q.select(F.explode(F.col(FAILED_RULES_COLUMN)).alias("rule"), "_run_id", "_quarantined_at")
            .groupBy("rule", "_run_id").agg(F.count(F.lit(1)).alias("rows"), F.max("_quarantined_at").alias("latest"))
            .orderBy("rule", "_run_id").collect())
    return [{"rule": r["rule"], "run_id": r["_run_id"], "rows": r["rows"], "latest": r["latest"]} for r in rows]


@dataclass
class ReplayResult:
    dataset: str
    run_id: str
    candidates: int = 0
    replayed: int = 0
    still_failing: int = 0
    still_failing_by_rule: dict[str, int] = field(default_factory=dict)
    snapshot_id: int | None = None
    published: bool = False


def _delete_ids(platform: Platform, ident: str, ids: list[str]) -> None:
    """Remove replayed rows from quarantine by id (a MERGE keyed on a temp view, no SQL pasting)."""
    spark = platform.spark()
    tables = platform.tables()
    view = f"lh_replayed_{uuid.uuid4().hex[:12]}"
    spark.createDataFrame([(i,) for i in ids], "_quarantine_id string").createOrReplaceTempView(view)
    try:
        spark.sql(f"MERGE INTO {tables.qualified(ident)} t USING {quote(view)} s "
                  "ON t._quarantine_id = s._quarantine_id WHEN MATCHED THEN DELETE")
    finally:
        spark.catalog.dropTempView(view)
