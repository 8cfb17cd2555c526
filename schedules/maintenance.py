"""Maintenance schedules from metadata: one per namespace, on `maintenance.schedule.<namespace>`
(else `maintenance.schedule`, else lakehouse.maintenance.DEFAULT_SCHEDULE). Stopped until an operator
starts it, like the pipelines' schedules."""

from __future__ import annotations

import dagster as dg

from lakehouse import maintenance
from lakehouse.metadata.model import MetadataCatalog


def build_maintenance_schedules(catalog: MetadataCatalog, jobs: dict) -> list[dg.ScheduleDefinition]:
    """`jobs`: {namespace: its maintenance job} (lakehouse_assets.maintenance_assets)."""
    out = []
    for ns, job in jobs.items():
        cron = maintenance.schedule(catalog, ns)
        out.append(dg.ScheduleDefinition(
            name=f"maintenance__{ns}__schedule", cron_schedule=cron, job=job, execution_timezone="UTC",
            default_status=dg.DefaultScheduleStatus.STOPPED,
            description=f"Table maintenance of namespace {ns!r} on its metadata cron {cron!r}."))
    return out
