"""Iceberg IO manager for PySpark DataFrames.

Inputs load as Spark DataFrames over the table's `main` branch (never an unaudited branch).
Outputs: a stage's load step hands over a `PublishedTable` (it already wrote, audited and
published through `lakehouse.runner`); a plain Python asset may return a DataFrame, which is
written through the same audit-branch-then-publish path.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from lakehouse.iceberg import branch_name_for_run
from lakehouse.metadata.model import Target
from lakehouse.publish import publish
from resources.lakehouse import LakehouseResource


@dataclass(frozen=True)
class PublishedTable:
    identifier: str
    snapshot_id: int | None


def identifier_for_key(key: dg.AssetKey) -> str:
    """[layer, table] → layer.table (the platform's naming for software-defined tables)."""
    path = key.path
    if len(path) < 2:
        raise ValueError(f"asset key {key.to_user_string()} has no namespace: expected [namespace, table]")
    return f"{path[-2]}.{path[-1]}"


class IcebergIOManager(dg.ConfigurableIOManager):
    lakehouse: LakehouseResource  # the platform, as every asset gets it (the code location's one resource)

    def handle_output(self, context: dg.OutputContext, obj) -> None:
        if obj is None or isinstance(obj, PublishedTable):
            return
        from pyspark.sql import DataFrame

        if not isinstance(obj, DataFrame):
            raise TypeError(f"IcebergIOManager stores Spark DataFrames, got {type(obj).__name__}")
        platform = self.lakehouse.platform()
        ident = identifier_for_key(context.asset_key)
        ns, tbl = ident.split(".", 1)
        mode = (context.definition_metadata or {}).get("write_mode", "overwrite")
        target = Target(target_id=ident, namespace=ns, table=tbl, write_mode=mode)
        tables = platform.tables()
        tables.ensure_table(target, obj.schema)
        branch = branch_name_for_run(context.run_id)
        tables.create_branch(ident, branch)
        res = tables.write(obj, target, branch=branch)
        snap = publish(tables, ident, branch)
        tables.drop_branch(ident, branch)
        context.add_output_metadata({"table": ident, "snapshot_id": str(snap), "rows_written": res.rows_written})

    def load_input(self, context: dg.InputContext):
        platform = self.lakehouse.platform()
        ident = identifier_for_key(context.asset_key)
        return platform.tables().read(ident)
