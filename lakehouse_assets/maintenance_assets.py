"""Dagster shell of `lakehouse.table.maintenance`: one maintenance asset per namespace (group `maintenance`)
and (schedules.maintenance) its schedule from metadata, which runs it through the platform's asset job.

The asset is ONE op per namespace: it maintains the namespace's tables one after another, as the
metadata says at run time (a table added since the last reload is maintained too, a changed policy
applies without a reload), and sums the results into the materialization metadata. One op per table
(each in the table's `target:<id>` pool) cost the code server about 5 s of CPU per load at 1,000
pipelines (3,000 ops in the maintenance graphs and their jobs: issue 22). Instead a namespace's
maintenance runs in its own pool (`maintenance:<ns>`, so two runs of it never overlap) and, while it
works on a table that a stage writes, holds a slot of the table's `target:<id>` pool, the pool of
the target's load ops (lakehouse_assets.pool_slots: it waits while loads fill the pool, so loads
and maintenance together never exceed the target's limit). Each table's procedures run under the
table's publish lock (lakehouse.runtime.coordination: a maintenance commit never lands between a
publisher's check and its commit; publishers of that table queue behind it), and orphan files are
never removed while a run holds a lease on the table (lakehouse.table.maintenance). A table's quarantine
table, once it exists, is maintained right after it, in the table's pool slot and under its lock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from lakehouse.metadata.model import MetadataCatalog, Target
from lakehouse.runtime.coordination import publish_lock
from lakehouse.table import maintenance
from lakehouse_assets.pool_slots import pool_slot

GROUP = "maintenance"


def asset_key(namespace: str) -> dg.AssetKey:
    return dg.AssetKey([GROUP, namespace])


def pool(namespace: str) -> str:
    return f"maintenance:{namespace}"


def target_pool(catalog: MetadataCatalog, target: Target) -> str | None:
    """The pool the target's load ops claim (factory: `target:<id>`), if a stage writes it; entity_raw
    tables are loaded in their source's pool, with no target pool to share."""
    return f"target:{target.target_id}" if catalog.stage_for_target(target.target_id) is not None else None


@contextmanager
def _table_slot(context, pool: str | None) -> Iterator[float]:
    if pool is None:
        yield 0.0
    else:
        with pool_slot(context, pool) as waited:
            yield waited


def _results_table(rows: list[dict]) -> str:
    lines = ["| table | due | files | snapshots expired | orphans removed |", "|---|---|---|---|---|"]
    lines += [f"| {r['table']} | {', '.join(r.get('due', [])) or r.get('skipped', 'nothing due')} | "
              f"{r.get('files_before', '-')} → {r.get('files_after', r.get('files_before', '-'))} | "
              f"{r.get('snapshots_expired', 0)} | {r.get('orphan_files_removed', 0)} |" for r in rows]
    return "\n".join(lines)


def _maintain(context: dg.AssetExecutionContext, namespace: str) -> dg.MaterializeResult:
    """The op's body: every table of the namespace the metadata names now, one after another."""
    platform = context.resources.lakehouse.platform()
    catalog = platform.catalog()
    rows, failed = [], []
    exists = platform.pyiceberg_catalog().table_exists
    for target in maintenance.namespaces(catalog, exists).get(namespace, []):
        owner = maintenance.owner(target)  # a quarantine table: its data table's pool and lock
        try:
            # the pool slot first, then the lock: the order a load takes them (its op's slot, then publish)
            with _table_slot(context, target_pool(catalog, owner)) as waited, \
                    publish_lock(platform, owner.identifier):
                res = maintenance.maintain(platform, target, run_id=context.run_id, catalog=catalog)
            if waited >= 0.05:
                res["pool_wait_s"] = round(waited, 1)
        except Exception as exc:  # noqa: BLE001 - audited by maintain(); the namespace's other tables go on
            context.log.error(f"{target.identifier}: maintenance failed: {type(exc).__name__}: {exc}")
            failed.append(f"{target.identifier}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            rows.append({"table": target.identifier, "skipped": "failed (see the audit log)"})
            continue
        context.log.info(f"{res['table']}: due {res.get('due', [])}; files {res.get('files_before')} -> "
                         f"{res.get('files_after', res.get('files_before'))}; {res.get('skipped', '')}")
        rows.append(res)
    md = {**maintenance.metadata_of(rows), "results": dg.MetadataValue.md(_results_table(rows))}
    if failed:
        raise dg.Failure(description=f"maintenance of {len(failed)} table(s) of namespace {namespace!r} failed: "
                                     + "; ".join(failed[:5]), metadata=md)
    return dg.MaterializeResult(metadata=md)


def maintenance_asset(namespace: str, targets: list[Target]) -> dg.AssetsDefinition:
    """The namespace's maintenance asset. It has no dependency on the tables it maintains: which
    tables those are is read at run time, and an edge from each (1,000 per namespace at 1,000
    pipelines) cost every reload client about 2.4 MB of the snapshots it fetches and the build half
    a second (issue 22), drew a thousand edges into the lineage graph, and let one failed table
    skip the whole namespace's maintenance in a run of both. Running beside a stage is safe: each
    table is maintained under its publish lock and a slot of its target pool."""
    description = (f"Table maintenance of namespace `{namespace}` (compaction, snapshot expiry, orphan files, "
                   f"manifests) as the targets' maintenance metadata says, one table after another (the "
                   f"namespace's tables when it runs; when last loaded: `tables`)")
    @dg.asset(key=asset_key(namespace), group_name=GROUP, description=description, pool=pool(namespace),
              required_resource_keys={"lakehouse"}, metadata={"tables": ", ".join(t.identifier for t in targets)},
              tags={"lakehouse/layer": namespace}, kinds={"iceberg"})
    def maintain_namespace(context):  # unannotated: Dagster reads the annotation, a string here
        return _maintain(context, namespace)

    return maintain_namespace


def maintenance_definitions(catalog: MetadataCatalog) -> dict[str, list]:
    from schedules.maintenance import build_maintenance_schedules

    assets, keys = [], {}
    for ns, targets in maintenance.namespaces(catalog).items():
        assets.append(maintenance_asset(ns, targets))
        keys[ns] = asset_key(ns)
    return {"assets": assets, "jobs": [], "schedules": build_maintenance_schedules(catalog, keys)}
