"""Maintenance schedules from metadata: one per namespace, on `maintenance.schedule.<namespace>`
(else `maintenance.schedule`, else lakehouse.table.maintenance.DEFAULT_SCHEDULE). Stopped until an operator
starts it, like the pipelines' schedules.

Each targets the platform's asset job with the namespace's maintenance asset selected, as a
pipeline's schedule selects its stages: a job of its own per namespace, resolved against the whole
asset graph, cost the code server about a second per load at 1,000 pipelines (issue 22)."""

from __future__ import annotations

import dagster as dg

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.table import maintenance
from lakehouse_assets.factory import PIPELINES_JOB

MAINTENANCE_TAG = "lakehouse/maintenance"


def build_maintenance_schedules(catalog: MetadataCatalog, keys: dict[str, dg.AssetKey]) -> list[dg.ScheduleDefinition]:
    """`keys`: {namespace: its maintenance asset's key} (lakehouse_assets.maintenance_assets)."""
    return [_schedule(ns, key, maintenance.schedule(catalog, ns)) for ns, key in keys.items()]


def _schedule(namespace: str, key: dg.AssetKey, cron: str) -> dg.ScheduleDefinition:
    @dg.schedule(name=f"maintenance__{namespace}__schedule", cron_schedule=cron, job_name=PIPELINES_JOB,
                 execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.STOPPED,
                 description=f"Table maintenance of namespace {namespace!r} on its metadata cron {cron!r}.")
    def _sched(context: dg.ScheduleEvaluationContext):
        return dg.RunRequest(asset_selection=[key], tags={MAINTENANCE_TAG: namespace})

    return _sched
