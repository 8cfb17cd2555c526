"""Schedules from metadata: one per pipeline with a cron; disabled pipelines skip with a reason.

A schedule targets the platform's asset job and selects its pipeline's stage assets in each
RunRequest (there is no job per pipeline: lakehouse_assets/factory.py `PIPELINES_JOB`)."""

from __future__ import annotations

import dagster as dg

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.throughput.queue import instance_of, request_tags
from lakehouse_assets.factory import PIPELINES_JOB, pipeline_selection
from resources.lakehouse import LakehouseResource


def build_schedules(catalog: MetadataCatalog) -> list[dg.ScheduleDefinition]:
    schedules = []
    for p in catalog.pipelines:
        if not p.schedule or not catalog.stages_of(p.pipeline_id):
            continue
        schedules.append(_schedule(p.pipeline_id, p.schedule, p.timezone, pipeline_selection(catalog, p.pipeline_id)))
    return schedules


def _schedule(pipeline_id: str, cron: str, tz: str, selection: list[dg.AssetKey]) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=f"{pipeline_id}__schedule",
        cron_schedule=cron,
        execution_timezone=tz,
        job_name=PIPELINES_JOB,
        description=f"Runs pipeline {pipeline_id!r} on its metadata cron {cron!r}.",
        default_status=dg.DefaultScheduleStatus.STOPPED,
    )
    def _sched(context: dg.ScheduleEvaluationContext, lakehouse: LakehouseResource):
        platform = lakehouse.platform()
        ok, reason = platform.store.enabled(pipeline_id)
        if not ok:
            return dg.SkipReason(reason)
        # dagster/priority etc. from the profile active now (a profile switch needs no redeploy)
        return dg.RunRequest(asset_selection=selection,
                             tags=request_tags(platform.store, pipeline_id, instance_of(context)))

    return _sched
