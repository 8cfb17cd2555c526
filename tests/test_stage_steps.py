"""A stage's step keys, and the stage they name (fast lane, no Dagster run).

A stage reading an external source is two ops (`<asset>__extract` in its source's pool,
`<asset>__load` in its target's); a stage reading lake tables only is one op named as its asset
(issue 22: half the ops a code server builds and snapshots). Alerts, the load API and run
summaries map a failed step back to its stage through `stage_node` for both forms.
"""

from __future__ import annotations

import pytest

from lakehouse.dagster_runs import stage_node


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
