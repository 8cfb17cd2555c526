"""Quarantine: rows failing a `quarantine` rule, kept next to the dataset with the failed rule names."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.runner import StageRunner


def quarantine_identifier(identifier: str) -> str:
    ns, tbl = identifier.split(".", 1)
    return f"{ns}.{tbl}__quarantine"


def write_quarantine(runner: StageRunner, bad: DataFrame) -> int:
    """Append failing rows (with `_failed_rules`, `_run_id`, `_quarantined_at`) to the quarantine table."""
    from pyspark.sql import functions as F

    from lakehouse.metadata.model import Target

    tables = runner.platform.tables()
    ident = quarantine_identifier(runner.target.identifier)
    ns, tbl = ident.split(".", 1)
    target = Target(target_id=f"{runner.target.target_id}__quarantine", namespace=ns, table=tbl)
    rows = bad.withColumn("_run_id", F.lit(runner.run_id)).withColumn("_quarantined_at", F.current_timestamp())
    tables.ensure_table(target, rows.schema, wap=False)
    tables.add_missing_columns(ident, rows.schema)
    res = tables.write(rows, target)
    return res.rows_written
