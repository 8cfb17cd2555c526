"""Schedules from metadata: one per pipeline with a cron; disabled pipelines skip with a reason.

A schedule targets the platform's asset job and selects its pipeline's stage assets in each
RunRequest (there is no job per pipeline: lakehouse_assets/factory.py `PIPELINES_JOB`)."""

from __future__ import annotations

import dagster as dg

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.orchestration.queue import instance_of, request_tags
from lakehouse_assets.factory import PIPELINES_JOB, pipeline_selection


def build_schedules(catalog: MetadataCatalog, pipelines: set[str] | None = None) -> list[dg.ScheduleDefinition]:
    """Every pipeline's schedule, or those of `pipelines` (a code location's)."""
    schedules = []
    for p in catalog.pipelines:
        if pipelines is not None and p.pipeline_id not in pipelines:
            continue
        if not p.schedule or not catalog.stages_of(p.pipeline_id):
            continue
        schedules.append(_schedule(p.pipeline_id, p.schedule, p.timezone, pipeline_selection(catalog, p.pipeline_id)))
    return schedules


class _Evaluate:
    """A pipeline schedule's evaluation: skipped while the pipeline is disabled, else a run of its
    stage assets with the tags of the profile active now (a profile switch needs no redeploy).

    A plain callable handed to `ScheduleDefinition`, not a `@dg.schedule` function: the decorator
    inspects each function's signature and resolves its type hints, about 0.4 s of CPU per build
    for 1,000 pipelines (issue 22); the resource comes from the context, as the decorator's does."""

    def __init__(self, pipeline_id: str, selection: list[dg.AssetKey]):
        self.pipeline_id, self.selection = pipeline_id, selection

    def __call__(self, context: dg.ScheduleEvaluationContext):
        platform = context.resources.lakehouse.platform()
        ok, reason = platform.store.enabled(self.pipeline_id)
        if not ok:  # a kill switch: no run, and the tick says who disabled it and when
            from lakehouse.control.flags import pipeline_stopped

            return dg.SkipReason(f"{pipeline_stopped(platform.store, self.pipeline_id) or reason}; no run "
                                 f"requested. Re-enable with `lakehouse pipeline enable {self.pipeline_id}`")
        return dg.RunRequest(asset_selection=self.selection,
                             tags=request_tags(platform.store, self.pipeline_id, instance_of(context)))


def _schedule(pipeline_id: str, cron: str, tz: str, selection: list[dg.AssetKey]) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=f"{pipeline_id}__schedule",
        cron_schedule=cron,
        execution_timezone=tz,
        job_name=PIPELINES_JOB,
        description=f"Runs pipeline {pipeline_id!r} on its metadata cron {cron!r}.",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        execution_fn=_Evaluate(pipeline_id, selection),
        required_resource_keys={"lakehouse"},
    )
