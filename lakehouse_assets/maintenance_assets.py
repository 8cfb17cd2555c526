"""Dagster shell of `lakehouse.maintenance`: one maintenance asset per namespace (group `maintenance`),
its job, and (schedules.maintenance) its schedule from metadata.

The asset is a graph: one op per Iceberg target of the namespace, each in that target's pool
(`target:<id>`, the pool its stage's writes use), so maintenance and writes of a table share its
throttle; a last op sums the results into the materialization metadata. Each op re-reads the target's
maintenance metadata at run time, so a changed policy applies without a reload."""

from __future__ import annotations

import re

import dagster as dg

from lakehouse import maintenance
from lakehouse.metadata.model import MetadataCatalog, Target

GROUP = "maintenance"


def asset_key(namespace: str) -> dg.AssetKey:
    return dg.AssetKey([GROUP, namespace])


def job_name(namespace: str) -> str:
    """Not `<x>_job`: a run worker asked for `<x>_job` first tries to build pipeline `<x>` alone."""
    return f"{namespace}__maintenance"


def _op_name(target_id: str) -> str:
    return "maintain__" + re.sub(r"[^A-Za-z0-9_]", "_", target_id)


class _Maintain:
    """The compute of one target's op (a class, not a closure, so the target id is plain data)."""

    def __init__(self, target_id: str):
        self.target_id = target_id

    def __call__(self, context, _inputs):
        platform = context.resources.lakehouse.platform()
        catalog = platform.catalog()
        target = maintenance.resolve_target(catalog, self.target_id)
        res = maintenance.maintain(platform, target, run_id=context.run_id, catalog=catalog)
        context.log.info(f"{res['table']}: due {res.get('due', [])}; files {res.get('files_before')} -> "
                         f"{res.get('files_after', res.get('files_before'))}; {res.get('skipped', '')}")
        yield dg.Output(res, "result")


def _summarize(context, inputs: dict):
    rows = list(inputs.values())
    md = maintenance.metadata_of(rows)
    lines = ["| table | due | files | snapshots expired | orphans removed |", "|---|---|---|---|---|"]
    lines += [f"| {r['table']} | {', '.join(r.get('due', [])) or r.get('skipped', '-')} | "
              f"{r.get('files_before', '-')} → {r.get('files_after', r.get('files_before', '-'))} | "
              f"{r.get('snapshots_expired', 0)} | {r.get('orphan_files_removed', 0)} |" for r in rows]
    context.add_output_metadata({**md, "results": dg.MetadataValue.md("\n".join(lines))}, output_name="result")
    yield dg.Output(None, "result")


def table_asset_key(catalog: MetadataCatalog, target: Target) -> dg.AssetKey | None:
    """The asset that writes `target` (a stage's `layer/table`, or `entity_raw/<app>`), if any."""
    stage = catalog.stage_for_target(target.target_id)
    if stage is not None:
        return dg.AssetKey([stage.layer, target.table])
    return dg.AssetKey([target.namespace, target.table]) if target.target_id.startswith("entity_raw:") else None


def maintenance_asset(namespace: str, targets: list[Target], upstream: list[dg.AssetKey | None]) -> dg.AssetsDefinition:
    """`upstream[i]`: the asset writing targets[i]; the op maintaining it runs after it (a "Materialize
    all" compacts what it has just written, never a table half-way through its run)."""
    names: list[str] = []
    for t in targets:  # target ids may hold '.', ':' and '-': two may sanitize to one op name
        name = _op_name(t.target_id)
        names.append(name if name not in names else f"{name}_{len(names)}")
    ops = [dg.OpDefinition(name=name, ins={"after": dg.In(dg.Nothing)} if up is not None else {},
                           outs={"result": dg.Out(dict)}, compute_fn=_Maintain(t.target_id),
                           pool=f"target:{t.target_id}", required_resource_keys={"lakehouse"},
                           description=f"Maintain {t.identifier} (in pool target:{t.target_id}).")
           for name, t, up in zip(names, targets, upstream, strict=True)]
    summary = dg.OpDefinition(name=f"maintenance__{namespace}__summary",
                              ins={op.name: dg.In(dict) for op in ops}, outs={"result": dg.Out(dg.Nothing)},
                              compute_fn=_summarize, description="Totals of the namespace's maintenance.")
    description = (f"Table maintenance of namespace `{namespace}` (compaction, snapshot expiry, orphan files, "
                   f"manifests) as the targets' maintenance metadata says: "
                   + ", ".join(f"`{t.identifier}`" for t in targets))
    inputs = {f"up_{i}": (op.name, key) for i, (op, key) in enumerate(zip(ops, upstream, strict=True))
              if key is not None}
    graph = dg.GraphDefinition(
        name=f"maintenance__{namespace}",
        description=description,
        node_defs=[*ops, summary],
        dependencies={summary.name: {op.name: dg.DependencyDefinition(op.name, "result") for op in ops}},
        input_mappings=[dg.InputMapping(graph_input_name=n, mapped_node_name=op_name, mapped_node_input_name="after")
                        for n, (op_name, _) in inputs.items()],
        output_mappings=[dg.OutputMapping(graph_output_name="result", mapped_node_name=summary.name,
                                          mapped_node_output_name="result")],
    )
    return dg.AssetsDefinition.from_graph(
        graph, keys_by_input_name={n: key for n, (_, key) in inputs.items()},
        keys_by_output_name={"result": asset_key(namespace)}, group_name=GROUP,
        descriptions_by_output_name={"result": description},
        metadata_by_output_name={"result": {"tables": ", ".join(t.identifier for t in targets)}},
        tags_by_output_name={"result": {"lakehouse/layer": namespace, "dagster/kind/iceberg": ""}},
    )


def maintenance_definitions(catalog: MetadataCatalog) -> dict[str, list]:
    from schedules.maintenance import build_maintenance_schedules

    assets, jobs = [], {}
    for ns, targets in maintenance.namespaces(catalog).items():
        assets.append(maintenance_asset(ns, targets, [table_asset_key(catalog, t) for t in targets]))
        jobs[ns] = dg.define_asset_job(job_name(ns), selection=dg.AssetSelection.assets(asset_key(ns)),
                                       description=f"Table maintenance of namespace {ns!r}.",
                                       tags={"lakehouse/maintenance": ns})
    return {"assets": assets, "jobs": list(jobs.values()), "schedules": build_maintenance_schedules(catalog, jobs)}
