"""A stage's step keys, and the stage they name (fast lane, no Dagster run).

A stage reading an external source is two ops (`<asset>__extract` in its source's pool,
`<asset>__load` in its target's); a stage reading lake tables only is one op named as its asset
(issue 22: half the ops a code server builds and snapshots). Alerts, the load API and run
summaries map a failed step back to its stage through `stage_node` for both forms.
"""

from __future__ import annotations

import inspect

import dagster as dg
import pytest

from lakehouse.orchestration.runs import stage_node
from tests.test_asset_graph_snapshot import demo_defs, demo_platform  # noqa: F401 - fixtures


@pytest.mark.parametrize(("step_key", "node"), [
    ("bronze__orders.bronze__orders__extract", "bronze__orders"),
    ("bronze__orders.bronze__orders__load", "bronze__orders"),
    ("silver__user_events", "silver__user_events"),  # one op: its step key is the asset's
    ("gold__daily_user_events", "gold__daily_user_events"),
    ("silver__load", "silver__load"),  # a table named like an op suffix: one op, left alone
    ("bronze__load.bronze__load__extract", "bronze__load"),
    ("", ""),
])
def test_stage_node_of_both_step_forms(step_key, node):
    assert stage_node(step_key) == node


def test_a_lake_stage_is_one_op_whose_extract_runs_inside_dagsters_error_boundary(demo_defs):  # noqa: F811
    """Dagster wraps the iteration of an op's compute function (not the call) in the error boundary
    that turns RetryRequested / Failure into the step's: the one op's extract must run when iterated."""
    silver, bronze = (demo_defs.resolve_assets_def(dg.AssetKey([layer, "user_events"])) for layer in ("silver", "bronze"))
    assert isinstance(silver.node_def, dg.OpDefinition) and silver.node_def.name == "silver__user_events"
    assert silver.node_def.pool == "target:silver_user_events"
    assert isinstance(bronze.node_def, dg.GraphDefinition)  # an ingesting stage keeps its two pools
    assert {op.pool for op in bronze.node_def.iterate_op_defs()} == {"source:user_events_raw",
                                                                    "target:bronze_user_events"}
    steps = silver.node_def.compute_fn(object(), {})  # a bogus context: nothing may run yet
    assert inspect.isgenerator(steps)
    with pytest.raises(AttributeError):
        next(steps)  # iterated, the extract runs (and fails on the bogus context)


def test_a_two_op_stage_adds_no_config_type_of_its_own(demo_defs):  # noqa: F811
    """Issue 22: a graph without a config mapping exposes its ops' config, one config type named
    after its two ops (and one holding it) per source-reading stage: 2,000 of the asset job's 2,038
    config types at 1,000 pipelines, in the snapshot every client fetches on every reload. With the
    mapping every graph's config is one shared type, and a run needs (and takes) no op config."""
    from dagster._core.snap import JobSnap

    job = demo_defs.resolve_implicit_global_asset_job_def()
    graphs = [a.node_def for a in demo_defs.resolve_asset_graph().assets_defs
              if a.is_executable and isinstance(a.node_def, dg.GraphDefinition)]
    assert graphs  # the demo's ingesting stage(s)
    inner = {op.name for g in graphs for op in g.iterate_op_defs()}
    types = JobSnap.from_job_def(job).config_schema_snapshot.all_config_snaps_by_key.values()
    fields = {f.name for t in types for f in (t.fields or [])}
    assert not inner & fields, sorted(inner & fields)  # no type names a stage's op
    ops = next(t for t in types if {g.name for g in graphs} <= {f.name for f in (t.fields or [])})
    graph_types = {f.type_key for f in ops.fields if f.name in {g.name for g in graphs}}
    assert len(graph_types) == 1, graph_types  # one type, whatever the number of stages
    # the mapping hands the ops no config: a run's plan (config resolved through it) has both steps
    from dagster._core.execution.api import create_execution_plan

    steps = {s.key for s in create_execution_plan(job).steps}
    assert {f"{g.name}.{op.name}" for g in graphs for op in g.iterate_op_defs()} <= steps
