"""Metadata → Dagster asset graph. Adding a pipeline is adding metadata, never code.

A stage reading an external source (files, S3, JDBC, an iceberg source: a `source:<id>` pool
and its throttle) becomes a graph-backed asset of two ops:
  * `<asset>__extract` runs in the source's pool (`source:<id>`): it plans the input
    (new files, JDBC ranges, a pinned snapshot) and does the source-side I/O;
  * `<asset>__load` runs in the target's pool (`target:<id>`): write to an audit branch,
    evaluate the stage's rules (each one an asset check), publish to main.
One op can sit in one pool only; splitting the asset this way makes per-source and
per-target limits hold at once. A stage reading lake tables only (SQL, a Python transformation,
another stage's table as its source) has no source pool to claim, so it is one op, `<asset>`, in
its target's pool: the same extract (pinning its upstream snapshots) then the same load, in one
step. Half the ops, graphs and config types of such stages: what a code server builds and
snapshots on every load and reload (issue 22).

The graph is built from what `lakehouse metadata apply` stored (`lakehouse.metadata.derived`): the
tables each stage reads, its column lineage and its checks are read, not derived, so building
thousands of assets parses no SQL. The ops, graphs and assets are constructed directly
(`OpDefinition`, `GraphDefinition`, `AssetsDefinition.from_graph`) rather than through the
decorators, which inspect signatures and type hints for every asset: the same definitions at
about half the cost per asset.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import dagster as dg

from lakehouse.control.attempt import Once
from lakehouse.control.retry import retry_exception
from lakehouse.engines.choice import asked_engine
from lakehouse.metadata import periods
from lakehouse.metadata.assets import pipeline_paths
from lakehouse.metadata.derive import StageDerivation
from lakehouse.metadata.derived import Structure
from lakehouse.metadata.engine_support import arrow_blockers, duckdb_sql_stage
from lakehouse.metadata.model import MetadataCatalog, Stage
from lakehouse.stage.core import AuditFailed
from lakehouse.stage.periods_written import written_periods
from lakehouse.stage.run_summary import NOT_EVALUATED
from lakehouse.stage.runner import StageRunner
from lakehouse.throughput.profiles import op_priority
from lakehouse.validation import CheckOutcome
from lakehouse_assets.preflight import preflight
from resources.io_manager import LAZY, StageWrite, audit_failure, publish_write, step_errors

#: observation metadata of a step that changed no data: the snapshot the table is still at
NOTHING_NEW_SINCE = "nothing_new_since_snapshot"

KINDS_BY_SOURCE = {"files": "file", "s3": "s3", "jdbc": "postgres", "iceberg": "iceberg"}


def stage_asset_key(catalog: MetadataCatalog, stage: Stage) -> dg.AssetKey:
    target = catalog.target(stage.target_id)
    return dg.AssetKey([stage.layer, target.table])


def source_asset_key(source_id: str) -> dg.AssetKey:
    return dg.AssetKey(["sources", source_id])


class Graph:
    """Lookups for one build, over a `Structure` (the structural rows and the derived rows)."""

    def __init__(self, structure: Structure):
        self.structure = structure
        self.catalog = catalog = structure.catalog
        self.targets = {t.target_id: t for t in catalog.targets}
        self.sources = {s.source_id: s for s in catalog.sources}
        self.pipelines = {p.pipeline_id: p for p in catalog.pipelines}
        self.producer = {s.target_id: s for s in catalog.stages}
        self.by_ident = {t.identifier.lower(): t for t in catalog.targets if t.kind == "iceberg"}
        self._downstream: dict[dg.AssetKey, frozenset[dg.AssetKey]] | None = None

    def key(self, stage: Stage) -> dg.AssetKey:
        return dg.AssetKey([stage.layer, self.targets[stage.target_id].table])

    def derived(self, stage: Stage) -> StageDerivation:
        return self.structure.derived[(stage.pipeline_id, stage.stage_name)]

    def producer_of(self, ident: str) -> Stage | None:
        t = self.by_ident.get(ident.lower())
        return self.producer.get(t.target_id) if t is not None else None

    def deps(self, stage: Stage) -> list[dg.AssetKey]:
        """Asset deps of a stage: the stages producing the tables its SQL or Python reads, and/or its source_id."""
        return list(self.upstream(stage))

    def upstream(self, stage: Stage) -> dict[dg.AssetKey, str | None]:
        """{asset key: the lake table it is (None: an external source)} of the stage's deps, in order."""
        keys: dict[dg.AssetKey, str | None] = {}
        if stage.transformation or stage.python_transformation is not None:
            for ident in self.derived(stage).upstream_tables:
                up = self.producer_of(ident)
                if up is not None:
                    keys.setdefault(self.key(up), self.targets[up.target_id].identifier.lower())
        if stage.source_id:
            up = self.producer.get(stage.source_id)
            if up is not None:
                keys.setdefault(self.key(up), self.targets[up.target_id].identifier.lower())
            elif stage.source_id in self.sources:
                keys.setdefault(source_asset_key(stage.source_id), None)
        return keys

    def downstream(self, stage: Stage) -> frozenset[dg.AssetKey]:
        """The stage assets reading this stage's table (of the stages this build knows the structure of)."""
        if self._downstream is None:
            readers: dict[dg.AssetKey, set[dg.AssetKey]] = {}
            for s in self.catalog.stages:
                if s.target_id not in self.targets:
                    continue
                try:
                    ups = self.upstream(s)
                except KeyError:  # a stage of a pipeline outside this build: no derived rows read
                    continue
                for up in ups:
                    readers.setdefault(up, set()).add(self.key(s))
            self._downstream = {k: frozenset(v) for k, v in readers.items()}
        return self._downstream.get(self.key(stage), frozenset())

    def column_lineage(self, stage: Stage) -> dict:
        """`dagster/column_lineage` (the UI's column view) from the stored lineage of the stage's SQL."""
        deps_by_column: dict[str, list[dg.TableColumnDep]] = {}
        for col, pairs in self.derived(stage).column_lineage.items():
            deps = []
            for ident, src_col in pairs:
                up = self.producer_of(ident)
                if up is not None:
                    deps.append(dg.TableColumnDep(asset_key=self.key(up), column_name=src_col))
            if deps:
                deps_by_column[col] = deps
        return {"dagster/column_lineage": dg.TableColumnLineage(deps_by_column=deps_by_column)} if deps_by_column \
            else {}


def stage_kinds(g: Graph, stage: Stage) -> list[str]:
    """The asset's kind badges: the engines that may write it (spark; arrow when the Arrow engine can
    and is asked to, both for `auto`), duckdb when its SQL runs there, then its format (iceberg). At
    most three: Dagster shows three kinds."""
    target = g.targets[stage.target_id]
    asked = asked_engine(g.catalog, target)[0]
    arrow = asked != "spark" and not arrow_blockers(
        stage, target, g.sources.get(stage.source_id or ""),
        g.catalog.rule_set(stage.validation_set_id).rules if stage.validation_set_id else [])
    kinds = (["duckdb"] if duckdb_sql_stage(stage) else []) + (["arrow"] if arrow else []) \
        + (["spark"] if not arrow or asked == "auto" else [])
    return (kinds + ["iceberg"])[:3]


def nothing_new(key: dg.AssetKey, outcome) -> dg.AssetObservation:
    """A step that changed no data records this instead of a materialization: the table is as it
    was at its snapshot, and why nothing was written (nothing new, a kill switch, ...)."""
    snap = str(outcome.snapshot_id) if outcome.snapshot_id is not None else "none"
    why = outcome.skipped_reason or "nothing written"
    return dg.AssetObservation(asset_key=key, description=f"nothing new since snapshot {snap}: {why}",
                               metadata={**outcome.metadata(), NOTHING_NEW_SINCE: snap})


def check_result(key: dg.AssetKey, outcome: CheckOutcome) -> dg.AssetCheckResult:
    rule = outcome.rule
    md: dict = {
        "failed_rows": outcome.failed_rows,
        "total_rows": outcome.total_rows,
        "counted": outcome.scope or "table",  # what total_rows counted: the change set, the merged keys' rows...
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


@dataclass(frozen=True)
class _Step:
    """What a stage's two ops need at run time; everything else is read from the control DB then."""

    key: dg.AssetKey
    pipeline_id: str
    stage_name: str
    spec_names: frozenset[str]
    input_tables: tuple[tuple[str, str], ...] = ()  # (load op input, lake table) of upstream stages' tables
    downstream: frozenset[dg.AssetKey] = frozenset()  # the stage assets reading this one's table
    partitioned: bool = False  # a time-partitioned target (one materialization per period written)

    def feeds_this_run(self, context: dg.OpExecutionContext) -> bool:
        """Whether a stage reading this one's table runs later in this run: Dagster starts it only
        after this step yields its output (a step whose upstream output is missing is skipped)."""
        selection = context.run.asset_selection
        return bool(self.downstream) if selection is None else any(k in selection for k in self.downstream)

    def runner(self, context: dg.OpExecutionContext) -> StageRunner:
        platform = context.resources.lakehouse.platform()
        preflight(context, platform)  # the whole run, before any write; cached per run
        # the run's tags, e.g. the arrival sensor's lakehouse/arrival_batch
        return StageRunner(platform, self.pipeline_id, self.stage_name, context.run_id, context.log,
                           run_tags=dict(context.run_tags))

    def retry(self, runner: StageRunner, context: dg.OpExecutionContext, exc: Exception, phase: str):
        """The stage's retry policy (read now) decides: a RetryRequested, or None to fail."""
        return retry_exception(runner.platform, self.pipeline_id, self.stage_name, context.run_id,
                               context.retry_number, exc, phase)


# An op's compute function is inspected when the op is built (its `context` parameter's annotation);
# for a callable object `inspect.signature` resolves `__call__` anew each time, 4,000 times per build.
# Given here: the parameters of `__call__` less `self`, as inspect finds them.
_COMPUTE_SIGNATURE = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                        for n in ("context", "inputs")])


class _Extract:
    """The extract op's body (a plain `compute_fn(context, inputs)`: one object per stage, no decorator)."""

    __signature__ = _COMPUTE_SIGNATURE

    def __init__(self, step: _Step):
        self.step = step

    def __call__(self, context, inputs) -> Iterator:
        yield dg.Output(self.plan(context), "result")

    def plan(self, context):
        step = self.step
        runner = step.runner(context)
        # the stage's retry policy, offered each unhealed error once: by the step's wrapper
        # (lakehouse.control.attempt, on the step's one budget) or by step_errors around the op
        runner.retry = retry = Once(lambda exc: step.retry(runner, context, exc, "extract"))
        with step_errors(retry):
            plan = runner.extract()
        context.log.info(f"{step.key.to_user_string()}: plan {plan.kind} {plan.details or ''}"
                         + (f" — skipped: {plan.skipped_reason}" if plan.skipped_reason else ""))
        return plan


class _Load:
    """The load op's body: write and audit on the branch, report the rules, then hand the audited
    write to the IO manager, which publishes it.

    The rules are evaluated before the output exists, so a failed blocking rule fails the step with
    its check results and no output at all: Dagster records no materialization (main is untouched,
    the audit branch kept). When they pass, `IcebergIOManager.handle_output` publishes while this
    generator waits at its `yield Output` (Dagster stores an output before it resumes the op), and
    the check results follow the materialization, from the final outcome (a remainder written
    again is audited again). The upstream tables arrive as loaders (the IO manager's, at the run's
    pinned snapshots), called only if the stage's SQL or Python runs.

    A materialization means the table changed (issue 39): a step that changed nothing (skipped,
    nothing new, a recompute identical to main) yields no output and logs an observation saying
    why, unless a stage of this run reads its table (Dagster skips a step whose upstream output is
    missing, and a reader of several tables must run when another one changed). A time-partitioned
    target in an unpartitioned run records one materialization per period its publish wrote."""

    __signature__ = _COMPUTE_SIGNATURE

    def __init__(self, step: _Step):
        self.step = step

    def __call__(self, context, inputs) -> Iterator:
        yield from self.load(context, inputs, inputs["plan"])

    def load(self, context, inputs, plan) -> Iterator:
        step, key = self.step, self.step.key
        runner = step.runner(context)  # the check is cached: a re-executed load checks too
        runner.upstream_frames = {ident: inputs[name] for name, ident in step.input_tables}
        runner.retry = retry = Once(partial(step.retry, runner, context, phase="load"))
        try:
            with step_errors(retry):
                staged = runner.write_and_audit(plan)
        except AuditFailed as exc:  # the failed checks, then the failure: no output, no materialization
            yield from self.results(exc.outcomes)
            raise audit_failure(runner, exc) from exc
        evaluated = {o.rule.name for o in staged.outcome.checks}
        not_evaluated = {n: staged.outcome.skipped_reason or "rule disabled" for n in sorted(step.spec_names - evaluated)}
        if not_evaluated:  # why, on the materialization (the UI), for the summary and the dashboard
            staged.outcome.extra[NOT_EVALUATED] = not_evaluated
        write = StageWrite(runner.reference(staged), retry=retry)  # a value: the IO manager publishes from it
        # Dagster records a materialization per partition of a partitioned run's output itself; an
        # unpartitioned run of a time-partitioned asset records one per period the publish wrote (below)
        by_dagster = context.has_partition_key or context.has_partition_key_range
        if (staged.changes_nothing or (step.partitioned and not by_dagster)) and not step.feeds_this_run(context):
            # nothing new (or periods to record one by one) and no stage of this run waits for the
            # output: no output, so no materialization of Dagster's own; published here instead
            outcome = publish_write(write, runner.platform, context.log).outcome
            recorded = False
        else:
            yield dg.Output(write, "result")  # the IO manager publishes it here: the materialization
            outcome = write.outcome
            recorded = True
        if step.partitioned and not by_dagster and outcome.published and not outcome.skipped_reason:
            recorded = self.record_periods(context, runner, outcome) or recorded
        if not recorded:  # what the UI shows instead of a materialization: nothing changed, and why
            context.log_event(nothing_new(key, outcome))
        # a check not evaluated gets no result: Dagster shows it as skipped (never a pass it did not earn)
        yield from self.results(outcome.checks)
        for name in sorted(step.spec_names - {o.rule.name for o in outcome.checks}):
            context.log.info(f"check {key.to_user_string()}:{name} not evaluated: "
                             f"{outcome.skipped_reason or not_evaluated.get(name) or 'rule disabled'}")

    def record_periods(self, context, runner: StageRunner, outcome) -> bool:
        """One materialization per period (partition) of the time-partitioned target the publish wrote,
        so the Partitions tab shows what exists; False when it wrote none."""
        keys = written_periods(runner.platform.pyiceberg_catalog(), runner.target,
                               [w.snapshot_id for w in outcome.writes])
        md = outcome.metadata()
        for k in keys:
            context.log_event(dg.AssetMaterialization(asset_key=self.step.key, partition=k, metadata=md))
        if keys:
            context.log.info(f"{self.step.key.to_user_string()}: materialized {len(keys)} partition(s) "
                             f"{keys[0]}..{keys[-1]}")
        return bool(keys)

    def results(self, outcomes: list[CheckOutcome]) -> Iterator[dg.AssetCheckResult]:
        """The asset check results of the stage's checks among `outcomes`."""
        return (check_result(self.step.key, o) for o in outcomes if o.rule.name in self.step.spec_names)


class _ExtractAndLoad(_Load):
    """The one op of a stage reading lake tables only: the extract's plan (its upstream snapshots
    pinned, once per run), then the load, each half with its own runner, retry phase and healing
    budget as in the two-op form. A retry of the step plans again: the run's first pin of each
    table wins (`lakehouse.stage.pins`), so it reads the same snapshots."""

    def __call__(self, context, inputs) -> Iterator:
        # a generator: the extract runs inside Dagster's error boundary, as the extract op's did
        # (its RetryRequested / Failure are the step's)
        plan = _Extract(self.step).plan(context)
        yield from self.load(context, inputs, plan)


# The ops' inputs and outputs are the same few kinds for every stage: built once and shared (they are
# immutable). Each `In`/`Out` resolves its Dagster type when built and again in its definition, and
# resolving a type is the costliest call of a build at 1,000 pipelines (issue 22).
# Their type is given (`Any`, what an unannotated op's outputs get anyway): an `Out` without one has it
# inferred again for every output definition made from it, 11,000 times at 1,000 pipelines.
# The stage's output is optional: a step that changed no data and that no stage of its run waits for
# yields none, so Dagster records no materialization for it (`_Load`).
_RESULT_OUT = dg.Out(dagster_type=Any, io_manager_key="iceberg_io_manager", is_required=False)
_CHECK_OUT = dg.Out(dagster_type=Any, is_required=False)
_PLAN_OUT = dg.Out(dagster_type=Any)
_INPUTS = {"nothing": dg.In(dg.Nothing), "lazy": dg.In(metadata={LAZY: True}), "plan": dg.In()}
_input_defs: dict[tuple[str, str], dg.InputDefinition] = {}


def _no_op_config(_config) -> dict:
    """The two ops of a source-reading stage take no config (they read the control DB at run time)."""
    return {}


# A graph without a config mapping exposes its ops' config (`ops: {<extract>: .., <load>: ..}`):
# one config type per graph named after its two ops, two per source-reading stage in the asset
# job's snapshot (2,000 of its 2,038 config types at 1,000 pipelines), fetched and parsed by every
# client on every reload. With this mapping a graph's config is an op's (`config: Any`, optional),
# one type shared by every graph; the ops get the config they always had (none).
_NO_OP_CONFIG = dg.ConfigMapping(config_fn=_no_op_config)


def _input(name: str, kind: str) -> dg.InputDefinition:
    """The op input `name` of this kind (`nothing`, `lazy`, `plan`), one definition per process."""
    d = _input_defs.get((name, kind))
    if d is None:
        d = _input_defs[(name, kind)] = _INPUTS[kind].to_definition(name)
    return d


def build_stage_asset(g: Graph, stage: Stage) -> dg.AssetsDefinition:
    """The stage's asset; its resources (`lakehouse`, `pyspark`, the IO manager) are bound by `Definitions`."""
    key = g.key(stage)
    target = g.targets[stage.target_id]
    pipeline = g.pipelines[stage.pipeline_id]
    source = g.sources.get(stage.source_id or "")
    derived = g.derived(stage)
    upstream = g.upstream(stage)
    deps = list(upstream)
    base = key.to_python_identifier()
    specs = [dg.AssetCheckSpec(name=c["name"], asset=key, description=c["description"], blocking=c["blocking"],
                               metadata=c["metadata"]) for c in derived.check_specs]
    input_names = [f"up_{i}" for i in range(len(deps))]
    # upstream stages' tables are real inputs of the load op (loaded by the IO manager); every dep,
    # external sources included, orders the extract (Nothing: it pins, it reads nothing through Dagster)
    tables_in = tuple((n, ident) for n, ident in zip(input_names, upstream.values(), strict=True) if ident)
    step = _Step(key, stage.pipeline_id, stage.stage_name, frozenset(s.name for s in specs),
                 tables_in, g.downstream(stage), target.time_partition is not None)
    op_tags = {"lakehouse/pipeline": stage.pipeline_id, "lakehouse/stage": stage.stage_name,
               # added to the run's (profile-driven) priority when a step claims a pool slot
               "dagster/priority": str(op_priority(pipeline.criticality))}
    source_pool = f"source:{source.source_id}" if source is not None and not stage.transformation else None
    check_outs = [s.get_python_identifier() for s in specs]  # `<asset>_<check>`, as @graph_asset names them
    description = ((stage.description or target.description or f"{stage.layer} table {target.identifier}")
                   + f"\n\nPipeline `{stage.pipeline_id}`, stage {stage.stage_order} `{stage.stage_name}`, "
                   f"write mode `{target.write_mode}`.")
    load_outs = {"result": _RESULT_OUT, **dict.fromkeys(check_outs, _CHECK_OUT)}
    if source_pool is None:  # lake tables only: one op, in the target's pool
        tables = dict(tables_in)
        node = dg.OpDefinition(
            name=base,
            # upstream stages' tables: lazy inputs; an external source's asset only orders it (Nothing)
            ins={n: _input(n, "lazy" if n in tables else "nothing") for n in input_names},
            outs=load_outs,
            compute_fn=_ExtractAndLoad(step),
            pool=f"target:{target.target_id}",
            tags=op_tags,
            required_resource_keys={"lakehouse", "pyspark"},
            description=f"Pin the upstream tables of {key.to_user_string()}, write {target.identifier} on an "
                        "audit branch, validate, publish to main.",
        )
    else:
        extract = dg.OpDefinition(
            name=f"{base}__extract",
            ins={n: _input(n, "nothing") for n in input_names},
            outs={"result": _PLAN_OUT},
            compute_fn=_Extract(step),
            pool=source_pool,
            tags=op_tags,
            required_resource_keys={"lakehouse", "pyspark"},
            description=f"Plan the input of {key.to_user_string()} (source-side I/O, in pool {source_pool}).",
        )
        load = dg.OpDefinition(
            name=f"{base}__load",
            ins={"plan": _input("plan", "plan"), **{n: _input(n, "lazy") for n, _ in tables_in}},
            outs=load_outs,
            compute_fn=_Load(step),
            pool=f"target:{target.target_id}",
            tags=op_tags,
            required_resource_keys={"lakehouse", "pyspark"},
            description=f"Write {target.identifier} on an audit branch, validate, publish to main.",
        )
        node = dg.GraphDefinition(
            name=base,
            description=description,
            config=_NO_OP_CONFIG,
            node_defs=[extract, load],
            dependencies={load.name: {"plan": dg.DependencyDefinition(extract.name, "result")}},
            input_mappings=[dg.InputMapping(graph_input_name=n, mapped_node_name=extract.name,
                                            mapped_node_input_name=n) for n in input_names]
            + [dg.InputMapping(graph_input_name=n, mapped_node_name=load.name, mapped_node_input_name=n)
               for n, _ in tables_in],
            output_mappings=[dg.OutputMapping(graph_output_name=n, mapped_node_name=load.name,
                                              mapped_node_output_name=n) for n in ("result", *check_outs)],
        )
    # the pipeline, the stage and the write mode are in the description (and the pipeline in a tag):
    # not repeated as entries, which every client of a reload fetched again (1.4 MB at 1,000 pipelines)
    metadata = {
        "table": target.identifier,
        **({"transformation": dg.MetadataValue.md(f"```sql\n{stage.transformation.strip()}\n```")}
           if stage.transformation else {}),
        **({"transformation": f"python: {stage.python_transformation.function}"}
           if stage.python_transformation is not None else {}),
        **({"column_lineage_note": derived.lineage_note} if derived.lineage_note else {}),
        **g.column_lineage(stage),
    }
    owners = [o for o in [stage.owner or pipeline.owner] if o]
    partitions = time_partitions(target)
    # Dagster's public constructor: one spec (what @multi_asset's `specs=` takes) for the node's
    # "result" output, the checks by their output names (`<asset>_<check>`, as @graph_asset names them)
    spec = dg.AssetSpec(
        key=key,
        deps=[dg.AssetDep(k) for k in dict.fromkeys(deps)],
        description=description,
        metadata=metadata,
        tags={"lakehouse/pipeline": stage.pipeline_id, "lakehouse/layer": stage.layer,
              **{f"dagster/kind/{k}": "" for k in stage_kinds(g, stage)}},
        owners=owners,
        group_name=stage.layer,
        partitions_def=partitions.get("partitions_def"),
    )
    return dg.AssetsDefinition(
        node_def=node,
        keys_by_input_name=dict(zip(input_names, deps, strict=True)),
        keys_by_output_name={"result": key},
        check_specs_by_output_name=dict(zip(check_outs, specs, strict=True)),
        specs=[spec],  # the partitions definition rides on the spec (the constructor refuses it twice)
        backfill_policy=partitions.get("backfill_policy"),
    )


PARTITIONS_DEFS = {"day": dg.DailyPartitionsDefinition, "hour": dg.HourlyPartitionsDefinition,
                   "month": dg.MonthlyPartitionsDefinition}


def time_partitions(target) -> dict:
    """A target with time partitions (metadata `time_partition`) is a daily-, hourly- or
    monthly-partitioned asset (UTC); a backfill of a range is one run (single-run policy) whose tags
    give the stage the periods to rewrite."""
    tp = target.time_partition
    if tp is None:
        return {}
    start = periods.key(tp.granularity, periods.first(tp.granularity, tp.start_date))
    return {"partitions_def": PARTITIONS_DEFS[tp.granularity](start_date=start),
            "backfill_policy": dg.BackfillPolicy.single_run()}


def build_source_specs(g: Graph, stages: list[Stage]) -> list[dg.AssetSpec]:
    """External sources (landing zones, buckets, databases) as non-materializable assets, for lineage."""
    used = {s.source_id for s in stages if s.source_id and s.source_id not in g.producer}
    specs = []
    for src in g.catalog.sources:
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


def build_stage_assets(g: Graph, pipelines: set[str] | None = None) -> dict[str, list[dg.AssetsDefinition]]:
    """{pipeline_id: its stage assets}, of every pipeline or of `pipelines` only (a run's build)."""
    out: dict[str, list[dg.AssetsDefinition]] = {}
    for s in g.catalog.stages:
        if pipelines is None or s.pipeline_id in pipelines:
            out.setdefault(s.pipeline_id, []).append(build_stage_asset(g, s))
    return out


# Dagster's implicit asset job: every asset of the code location, what the UI's "Materialize" and
# Dagster's own automation launch with an asset selection. A pipeline's run is this job with the
# pipeline's stage assets selected (`pipeline_selection`): no job per pipeline, whose thousand
# snapshots made every code-server load and reload pay for every pipeline (issue 22), and no second
# job over every stage asset either (another snapshot of the whole graph). Its name is Dagster's
# (its implicit asset job name; tests check they agree).
PIPELINES_JOB = "__ASSET_JOB"


def pipeline_selection(catalog: MetadataCatalog, pipeline_id: str) -> list[dg.AssetKey]:
    """The asset keys a run of the pipeline selects: its stages, in stage order."""
    return [dg.AssetKey(list(p)) for p in pipeline_paths(catalog, pipeline_id)]


def upstream_specs(g: Graph, assets: list[dg.AssetsDefinition]) -> list[dg.AssetSpec]:
    """The upstream stage tables `assets` read as inputs but do not produce (another pipeline's,
    in a build of some pipelines only): external specs the IO manager loads them through."""
    produced = {k for a in assets for k in a.keys}
    wanted = {k for a in assets for k in a.dependency_keys if k not in produced and k.path[0] != "sources"}
    return [dg.AssetSpec(k).with_io_manager_key("iceberg_io_manager") for k in sorted(wanted, key=str)]
