"""Reading what a Dagster run says about itself: its failed steps and their messages.

Shared by the alert sensors (the alert quotes the run's failure message) and the load service
(`GET /load/{id}` shows the error). Only the instance's public event-log API is used.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse.metadata.model import MetadataCatalog


def stage_node(step_key: str) -> str:
    """The stage's node name (`<layer>__<table>`, its asset key as a Python identifier) of a step:
    "<graph>.<graph>__extract|load" for a stage reading an external source (two ops, one per pool),
    "<layer>__<table>" for a stage reading lake tables only (one op)."""
    graph, dot, op = step_key.rpartition(".")
    if not dot:  # one op: no graph around it (and a table may be named `load`)
        return op
    return graph.rsplit(".", 1)[-1]


def step_failures(instance: Any, run_id: str) -> list[tuple[str, str]]:
    """(step key, message) per failed step: a `dagster.Failure`'s description, else the error text."""
    import dagster as dg

    out = []
    for rec in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
        ev = rec.dagster_event
        data = ev.event_specific_data
        user = getattr(data, "user_failure_data", None)
        err = getattr(data, "error", None)
        text = (user.description if user is not None and user.description else None) or (
            _user_error(err) if err is not None else ev.message or "")
        out.append((ev.step_key or "", text))
    return out


def _user_error(err: Any) -> str:
    """The op's own exception text: Dagster wraps it in DagsterExecutionStepExecutionError (the
    cause holds it) and prefixes `module.Class: `, which the exception's str() has not."""
    while getattr(err, "cls_name", None) == "DagsterExecutionStepExecutionError" and getattr(err, "cause", None):
        err = err.cause
    text = (err.message or "").strip()
    m = re.match(r"^(?:[A-Za-z_][\w]*\.)*" + re.escape(err.cls_name or "") + r": ", text) if err.cls_name else None
    return text[m.end():] if m else text


def run_failure_message(instance: Any, run_id: str) -> str | None:
    """The RUN_FAILURE event's message (e.g. a run worker that died before any step failed)."""
    import dagster as dg

    recs = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return recs[-1].dagster_event.message if recs else None


def failure_summary(instance: Any, run_id: str, fallback: str, catalog: MetadataCatalog
                    ) -> tuple[str, list[tuple[str, str | None]]]:
    """The run's failure message (each failed step's own error, as the UI shows it) and, per failed
    step, (pipeline.stage, dataset) — or (step key, None) for a step that is no stage's."""
    # a stage is asset [layer, target table] (lakehouse_assets.factory.stage_asset_key), its step
    # keys "<layer>__<table>.<layer>__<table>__extract|load" or "<layer>__<table>" (stage_node)
    owners = {f"{s.layer}__{catalog.target(s.target_id).table}": (f"{s.pipeline_id}.{s.stage_name}",
                                                                   catalog.target(s.target_id).identifier)
              for s in catalog.stages}
    failures = step_failures(instance, run_id)
    failed = [owners.get(stage_node(step), (step, None)) for step, _ in failures]
    return ("\n".join(f"{step}: {text}" for step, text in failures) or fallback), failed
