"""Kill switch enforcement: stop queued and in-flight runs of pipelines the control flags disable.

The flags are read from the control DB on every call (`MetadataStore.enabled`), so a flip by CLI
or by a plain SQL UPDATE applies at the next sensor tick. A run is matched by its
`lakehouse/pipeline` tag (every sensor and schedule of the platform and `lakehouse run` set it) or,
for a run launched from the UI, by the pipeline owning every stage asset it selects. Stopping uses
`instance.run_coordinator.cancel_run`, exactly what the UI's Terminate does: a queued run is
cancelled in the queue, a started one is terminated by the run launcher. A stage-level flag stops
a run only when every stage the run materializes is disabled; otherwise the stage's own checks
(before extract, before load, before publish) stop just that stage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse.metadata.assets import pipeline_of_run, stage_paths

if TYPE_CHECKING:
    from lakehouse.platform import Platform

log = logging.getLogger(__name__)

PIPELINE_TAG = "lakehouse/pipeline"
ACTIVE = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")


@dataclass(frozen=True)
class StopDecision:
    run_id: str
    pipeline_id: str
    status: str  # the run's status when the decision was taken
    reason: str
    stages: tuple[str, ...] = ()  # the stages the run materializes (when it selects some)

    @property
    def action(self) -> str:
        return "cancel" if self.status in ("QUEUED", "NOT_STARTED") else "terminate"


def _stages_of_run(run: Any, platform: Platform) -> list[tuple[str, str]]:
    """(pipeline, stage) of every asset the run materializes, via the metadata's asset keys."""
    keys = getattr(run, "asset_selection", None)
    if not keys:
        return []
    by_path = stage_paths(platform.catalog())  # a stage's asset key is [layer, target table]
    return [by_path[tuple(k.path)] for k in keys if tuple(k.path) in by_path]


def runs_to_stop(instance: Any, platform: Platform) -> list[StopDecision]:
    """Active runs whose pipeline (or every selected stage) is disabled right now."""
    import dagster as dg

    statuses = [dg.DagsterRunStatus[s] for s in ACTIVE]
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=statuses))
    verdicts: dict[str, tuple[bool, str]] = {}
    out = []
    for run in runs:
        # tagged by the platform's schedules, sensors and `lakehouse run`; a UI "Materialize" of a
        # pipeline's assets is known by what it selects
        pid = run.tags.get(PIPELINE_TAG) or (
            pipeline_of_run(run.tags, [k.path for k in run.asset_selection], platform.catalog())
            if getattr(run, "asset_selection", None) else None)
        if not pid:
            continue
        if pid not in verdicts:
            verdicts[pid] = platform.store.enabled(pid)
        ok, reason = verdicts[pid]
        stages = _stages_of_run(run, platform)
        if ok:
            checks = [platform.store.enabled(p, s) for p, s in stages]
            if checks and not any(c[0] for c in checks):
                ok, reason = False, "; ".join(dict.fromkeys(c[1] for c in checks))
        if not ok:
            out.append(StopDecision(run.run_id, pid, run.status.value, reason, tuple(s for _, s in stages)))
    return out


def enforce(instance: Any, platform: Platform) -> list[StopDecision]:
    """Cancel/terminate every run `runs_to_stop` finds; each stop is written to audit_log."""
    done = []
    for d in runs_to_stop(instance, platform):
        try:
            ok = instance.run_coordinator.cancel_run(d.run_id)
        except Exception as exc:  # noqa: BLE001 - one stuck run must not keep the others running
            ok = False
            log.exception("kill switch could not stop run %s", d.run_id)
            platform.store.audit(run_id=d.run_id, pipeline_id=d.pipeline_id, event="kill_switch",
                                 action=d.action, outcome="error", message=f"{d.reason}: {exc}")
            continue
        platform.store.audit(run_id=d.run_id, pipeline_id=d.pipeline_id, event="kill_switch", action=d.action,
                             outcome=("cancelled" if d.action == "cancel" else "terminated") if ok else "not_stopped",
                             message=d.reason, details={"status_before": d.status})
        log.warning("kill switch: %s run %s of %s (%s)", d.action, d.run_id, d.pipeline_id, d.reason)
        if ok:
            from lakehouse.ops import alerts

            alerts.kill_switch_run(platform.store, d.run_id, d.pipeline_id, d.reason, d.action, d.stages)
        done.append(d)
    return done
