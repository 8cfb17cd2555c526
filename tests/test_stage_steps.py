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

from lakehouse.dagster_runs import stage_node
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
