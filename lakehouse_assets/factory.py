"""Metadata → Dagster asset graph. Adding a pipeline is adding metadata, never code.

Each stage becomes a graph-backed asset of two ops:
  * `<asset>__extract` runs in the source's pool (`source:<id>`): it plans the input
    (new files, pinned upstream snapshots, JDBC ranges) and does the source-side I/O;
  * `<asset>__load` runs in the target's pool (`target:<id>`): write to an audit branch,
    evaluate the stage's rules (each one an asset check), publish to main.
One op can sit in one pool only; splitting the asset this way makes per-source and
per-target limits hold at once.
"""


import inspect
import json
from collections.abc import Iterator

import dagster as dg

from lakehouse.control.retry import retry_exception
from lakehouse.metadata.model import MetadataCatalog, Stage
from lakehouse.runner import AuditFailed, ExtractPlan, StageDisabled, StageRunner
from lakehouse.throughput.profiles import op_priority
from lakehouse.validation import CheckOutcome
from lakehouse.validation.rules import describe as describe_rule
from lakehouse_assets.preflight import preflight
from resources.io_manager import PublishedTable

KINDS_BY_SOURCE = {"files": "file", "s3": "s3", "jdbc": "postgres", "iceberg": "iceberg"}


def stage_asset_key(catalog: MetadataCatalog, stage: Stage) -> dg.AssetKey:
    target = catalog.target(stage.target_id)
    return dg.AssetKey([stage.layer, target.table])


def source_asset_key(source_id: str) -> dg.AssetKey:
    return dg.AssetKey(["sources", source_id])


def upstream_keys(catalog: MetadataCatalog, stage: Stage) -> list[dg.AssetKey]:
    """Asset deps of a stage: from its SQL (sqlglot) and/or its source_id."""
    from lakehouse.sqlparse import tables_in_sql

    keys: list[dg.AssetKey] = []
    if stage.transformation:
        for ident in tables_in_sql(stage.transformation):
            t = catalog.target_by_identifier(ident)
            producer = catalog.stage_for_target(t.target_id) if t else None
            if producer is not None:
                keys.append(stage_asset_key(catalog, producer))
    if stage.source_id:
        producer = catalog.stage_for_target(stage.source_id)
        if producer is not None:
            keys.append(stage_asset_key(catalog, producer))
        elif any(s.source_id == stage.source_id for s in catalog.sources):
            keys.append(source_asset_key(stage.source_id))
    return list(dict.fromkeys(keys))


def check_specs_for(catalog: MetadataCatalog, stage: Stage, key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    if not stage.validation_set_id:
        return []
    specs = []
    for rule in catalog.rule_set(stage.validation_set_id).rules:
        specs.append(
            dg.AssetCheckSpec(
                name=rule.name,
                asset=key,
                description=rule.description or f"{rule.type} ({rule.severity}, action {rule.action})",
                blocking=rule.severity == "error",
                metadata={"rule_type": rule.type, "severity": rule.severity, "action": rule.action,
                          "enabled": rule.enabled, "rule_expression": describe_rule(rule)},
            )
        )
    return specs


def check_result(key: dg.AssetKey, outcome: CheckOutcome) -> dg.AssetCheckResult:
    rule = outcome.rule
    md: dict = {
        "failed_rows": outcome.failed_rows,
        "total_rows": outcome.total_rows,
        "rule_expression": dg.MetadataValue.text(outcome.expression or rule.type),
        "message": outcome.message,
        "rule_type": rule.type,
        "severity": rule.severity,
        "action": rule.action,
    }
    if outcome.sample:
        md["failing_sample"] = dg.MetadataValue.json([{k: str(v) for k, v in r.items()} for r in outcome.sample])
    if outcome.details:
        md["details"] = dg.MetadataValue.json(json.loads(json.dumps(outcome.details, default=str)))
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=rule.name,
        passed=outcome.passed,
        severity=dg.AssetCheckSeverity.ERROR if rule.severity == "error" else dg.AssetCheckSeverity.WARN,
        metadata=md,
        description=outcome.message,
    )


def _check_output_name(key: dg.AssetKey, check_name: str) -> str:
    return f"{key.to_python_identifier()}_{check_name}"


def build_stage_asset(catalog: MetadataCatalog, stage: Stage) -> dg.AssetsDefinition:
    key = stage_asset_key(catalog, stage)
    target = catalog.target(stage.target_id)
    pipeline = catalog.pipeline(stage.pipeline_id)
    source = next((s for s in catalog.sources if s.source_id == stage.source_id), None)
    specs = check_specs_for(catalog, stage, key)
    deps = upstream_keys(catalog, stage)
    base = key.to_python_identifier()
    pipeline_id, stage_name = stage.pipeline_id, stage.stage_name
    op_tags = {"lakehouse/pipeline": pipeline_id, "lakehouse/stage": stage_name,
               # added to the run's (profile-driven) priority when a step claims a pool slot
               "dagster/priority": str(op_priority(pipeline.criticality))}

    source_pool = f"source:{source.source_id}" if source is not None and not stage.transformation else None
    input_names = [f"up_{i}" for i in range(len(deps))]

    @dg.op(
        name=f"{base}__extract",
        ins={n: dg.In(dg.Nothing) for n in input_names},
        pool=source_pool,
        tags=op_tags,
        required_resource_keys={"lakehouse"},
        description=f"Plan the input of {key.to_user_string()} (source-side I/O, in pool {source_pool or 'none'}).",
    )
    def extract(context: dg.OpExecutionContext) -> ExtractPlan:
        preflight(context, context.resources.lakehouse.platform())  # the whole run, before any write
        runner = StageRunner(context.resources.lakehouse.platform(), pipeline_id, stage_name,
                             context.run_id, context.log)
        runner.run_tags = dict(context.run_tags)  # e.g. the sensor's lakehouse/arrival_batch
        try:
            plan = runner.extract()
        except StageDisabled as exc:
            raise dg.Failure(description=str(exc)) from exc
        except Exception as exc:  # unhealed: the stage's retry policy (read now) decides
            retry = retry_exception(runner.platform, pipeline_id, stage_name, context.run_id,
                                    context.retry_number, exc, "extract")
            if retry is None:
                raise
            raise retry from exc
        context.log.info(f"{key.to_user_string()}: plan {plan.kind} {plan.details or ''}"
                         + (f" — skipped: {plan.skipped_reason}" if plan.skipped_reason else ""))
        return plan

    check_outs = {_check_output_name(key, s.name): dg.Out(is_required=False) for s in specs}
    spec_names = {s.name for s in specs}

    @dg.op(
        name=f"{base}__load",
        pool=f"target:{target.target_id}",
        tags=op_tags,
        required_resource_keys={"lakehouse"},
        out={"result": dg.Out(io_manager_key="iceberg_io_manager"), **check_outs},
        description=f"Write {target.identifier} on an audit branch, validate, publish to main.",
    )
    def load(context: dg.OpExecutionContext, plan: ExtractPlan) -> Iterator:
        preflight(context, context.resources.lakehouse.platform())  # cached: a re-executed load checks too
        runner = StageRunner(context.resources.lakehouse.platform(), pipeline_id, stage_name,
                             context.run_id, context.log)
        try:
            outcome = runner.load(plan)
        except AuditFailed as exc:
            for o in exc.outcomes:
                if o.rule.name in spec_names:
                    yield check_result(key, o)
            raise dg.Failure(description=str(exc), metadata={
                "dataset": target.identifier, "stage": f"{pipeline_id}.{stage_name}", "audit_branch": exc.branch,
                "failed_rules": ", ".join(o.rule.name for o in exc.outcomes if o.blocking_failure),
                "next_step": f"lakehouse branches show {target.identifier} {exc.branch}"}) from exc
        except StageDisabled as exc:
            raise dg.Failure(description=str(exc)) from exc
        except Exception as exc:
            retry = retry_exception(runner.platform, pipeline_id, stage_name, context.run_id,
                                    context.retry_number, exc, "load")
            if retry is None:
                raise
            raise retry from exc
        yield dg.Output(PublishedTable(target.identifier, outcome.snapshot_id), "result",
                        metadata=outcome.metadata())
        reported = set()
        for o in outcome.checks:
            if o.rule.name in spec_names:
                reported.add(o.rule.name)
                yield check_result(key, o)
        for name in spec_names - reported:  # nothing new to audit (skipped run): say so, do not fake a pass
            yield dg.AssetCheckResult(asset_key=key, check_name=name, passed=True,
                                      metadata={"message": outcome.skipped_reason or "rule disabled"},
                                      description=f"not evaluated: {outcome.skipped_reason or 'rule disabled'}")

    def compose(**kwargs):
        outs = load(extract(**kwargs))
        if not specs:
            return {"result": outs} if not isinstance(outs, tuple) else {"result": outs[0]}
        names = ["result", *check_outs]
        return dict(zip(names, outs, strict=True))

    compose.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in input_names]
    )
    kinds = {"spark", "iceberg"}
    return dg.graph_asset(
        key=key,
        ins={n: dg.AssetIn(key=k, dagster_type=dg.Nothing) for n, k in zip(input_names, deps, strict=True)},
        check_specs=specs,
        group_name=stage.layer,
        kinds=kinds,
        owners=[o for o in [stage.owner or pipeline.owner] if o],
        description=(stage.description or target.description or f"{stage.layer} table {target.identifier}")
        + f"\n\nPipeline `{pipeline_id}`, stage {stage.stage_order} `{stage_name}`, write mode `{target.write_mode}`.",
        metadata={
            "table": target.identifier,
            "pipeline": pipeline_id,
            "stage": stage_name,
            "write_mode": target.write_mode,
            **({"transformation": dg.MetadataValue.md(f"```sql\n{stage.transformation.strip()}\n```")}
               if stage.transformation else {}),
            **column_lineage_metadata(catalog, stage),
        },
        tags={"lakehouse/pipeline": pipeline_id, "lakehouse/layer": stage.layer},
    )(compose)


def column_lineage_metadata(catalog: MetadataCatalog, stage: Stage) -> dict:
    """`dagster/column_lineage` from the stage's SQL (lakehouse.lineage.columns), for the UI's column view."""
    from lakehouse.lineage.columns import upstream_column_deps

    deps = upstream_column_deps(catalog, stage)
    if not deps:
        return {}
    key_of = {t: stage_asset_key(catalog, catalog.stage_for_target(t)) for c in deps.values() for t, _ in c}
    return {"dagster/column_lineage": dg.TableColumnLineage(deps_by_column={
        col: [dg.TableColumnDep(asset_key=key_of[t], column_name=c) for t, c in cols] for col, cols in deps.items()})}


def build_source_specs(catalog: MetadataCatalog) -> list[dg.AssetSpec]:
    """External sources (landing zones, buckets, databases) as non-materializable assets, for lineage."""
    used = {s.source_id for s in catalog.stages if s.source_id and catalog.stage_for_target(s.source_id) is None}
    specs = []
    for src in catalog.sources:
        if src.source_id not in used:
            continue
        where = src.path or (f"s3://{src.bucket}/{src.prefix}" if src.bucket else src.table or "query")
        specs.append(
            dg.AssetSpec(
                key=source_asset_key(src.source_id),
                group_name="sources",
                kinds={KINDS_BY_SOURCE.get(src.kind, src.kind)},
                description=src.description or f"{src.kind} source {where}",
                metadata={"source_kind": src.kind, "location": where, "format": src.format or ""},
            )
        )
    return specs


def build_assets(catalog: MetadataCatalog) -> list:
    return [*build_source_specs(catalog), *(build_stage_asset(catalog, s) for s in catalog.stages)]


def pipeline_jobs(catalog: MetadataCatalog) -> list:
    jobs = []
    for p in catalog.pipelines:
        keys = [stage_asset_key(catalog, s) for s in catalog.stages_of(p.pipeline_id)]
        if not keys:
            continue
        jobs.append(
            dg.define_asset_job(
                name=f"{p.pipeline_id}_job",
                selection=dg.AssetSelection.assets(*keys),
                description=p.description or f"all stages of pipeline {p.pipeline_id}",
                tags={"lakehouse/pipeline": p.pipeline_id},
            )
        )
    return jobs
