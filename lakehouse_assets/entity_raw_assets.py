"""Dagster shell of `lakehouse.stage.entity_raw`: one asset per registered application (group entity_raw),
an arrival sensor on each application's extraction output prefix, the 10-minute table job, and one
load job per application that the load API (`lakehouse serve`) submits."""

from __future__ import annotations

import json

import dagster as dg

from lakehouse.metadata.model import Application, MetadataCatalog
from lakehouse.orchestration.gateway import load_job_name
from lakehouse.service import jobs
from lakehouse.stage import entity_raw
from lakehouse.stage.runner import Platform
from resources.lakehouse import LakehouseResource

TABLES_JOB = "entity_raw_tables_job"


def entity_raw_asset_key(application_id: str) -> dg.AssetKey:
    return dg.AssetKey([entity_raw.NAMESPACE, application_id.lower()])


def _asset(catalog: MetadataCatalog, app: Application) -> dg.AssetsDefinition:
    app_id = app.application_id
    src = next((s for s in catalog.sources if s.source_id == app.source_id), None)
    where = (f"s3://{src.bucket}/{src.prefix}" if src is not None and src.kind == "s3"
             else (src.path if src is not None else "load requests only"))

    @dg.asset(
        key=entity_raw_asset_key(app_id),
        group_name="entity_raw",
        kinds={"spark", "iceberg"},
        # a `throttles` row on the application's source limits its loads (pipelines' and the API's alike)
        pool=f"source:{app.source_id}" if app.source_id else None,
        required_resource_keys={"lakehouse"},
        description=(app.description or f"Raw extraction records of {app_id}")
        + f"\n\nTable `{entity_raw.table_identifier(app_id)}`, fed from `{where}`; raw rows kept as JSON in `raw_record`.",
        metadata={"table": entity_raw.table_identifier(app_id), "application": app_id, "source": where},
        tags={"lakehouse/layer": "entity_raw"},
    )
    def _load(context) -> dg.MaterializeResult:  # unannotated: postponed annotations fail Dagster's context check
        platform = context.resources.lakehouse.platform()
        job_id = context.run_tags.get(jobs.JOB_TAG)
        if job_id:  # a POST /load of the load API: exactly that request
            res = jobs.run(platform, job_id, context.run_id, app_id)
        else:
            res = entity_raw.load_new_files(platform, app_id, context.run_id, dict(context.run_tags))
        context.log.info(f"{res.table}: {res.files_loaded} file(s), {res.rows_written} row(s)"
                         + (f", {len(res.quarantined)} quarantined" if res.quarantined else ""))
        return dg.MaterializeResult(metadata=res.metadata())

    return _load


def _sensor(app: Application, source_id: str) -> dg.SensorDefinition:
    app_id = app.application_id

    @dg.sensor(
        name=f"entity_raw__{app_id.lower()}__arrivals",
        description=f"New extraction output of application {app_id!r} (source {source_id!r}) loads entity_raw.",
        asset_selection=dg.AssetSelection.assets(entity_raw_asset_key(app_id)),
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def _arrivals(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
        from lakehouse.ingest.s3 import ARRIVAL_TAG
        from lakehouse.sources.arrivals import poll_source

        platform = lakehouse.platform()
        decision = poll_entity_raw(platform, app_id, context.cursor, poll_source)
        if decision.cursor is not None:
            context.update_cursor(decision.cursor)
        if decision.skip_reason:
            return dg.SkipReason(decision.skip_reason)
        return dg.SensorResult(run_requests=[
            dg.RunRequest(run_key=b.run_key, tags={"lakehouse/application": app_id, ARRIVAL_TAG: b.run_key,
                                                   "lakehouse/files": str(len(b.files)), **decision.tags})
            for b in decision.batches])

    return _arrivals


def poll_entity_raw(platform: Platform, app_id: str, cursor: str | None, poll_source):
    """Skip when the application is unregistered/disabled or its source is switched off."""
    from lakehouse.ingest.arrivals import ArrivalDecision

    catalog = platform.catalog()
    try:
        app = entity_raw.require_application(catalog, app_id)
    except entity_raw.UnknownApplication as exc:
        return ArrivalDecision(skip_reason=str(exc), cursor=cursor)
    if platform.store.flag("source", app.source_id) is False:
        return ArrivalDecision(skip_reason=f"source {app.source_id!r} is disabled by control_flags", cursor=cursor)
    return poll_source(platform, catalog.source(app.source_id), cursor, None)


@dg.op(required_resource_keys={"lakehouse"}, description="Create entity_raw.<app> for every registered application.")
def ensure_entity_raw_tables(context) -> None:  # no annotation: postponed (string) annotations fail Dagster's check
    created = entity_raw.ensure_all_tables(context.resources.lakehouse.platform())
    context.log.info(f"created: {json.dumps(created)}" if created else "every registered application has its table")


@dg.job(name=TABLES_JOB, description="Proactive entity_raw table creation (also runs at start-up).")
def entity_raw_tables_job():
    ensure_entity_raw_tables()


@dg.schedule(
    name="entity_raw_tables__every_10_minutes",
    job=entity_raw_tables_job,
    cron_schedule="*/10 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="New applications get their entity_raw table within 10 minutes of registration. The tick "
    "creates missing tables itself (PyIceberg, milliseconds) and launches no run; "
    f"`{TABLES_JOB}` does the same on demand.",
)
def entity_raw_tables_schedule(context: dg.ScheduleEvaluationContext, lakehouse: LakehouseResource):
    created = entity_raw.ensure_all_tables(lakehouse.platform())
    return dg.SkipReason("created " + ", ".join(created) if created else "every registered application has its table")


def _load_job(app: Application) -> dg.UnresolvedAssetJobDefinition:
    """The job the load API submits for one application (`lakehouse.orchestration.gateway`)."""
    return dg.define_asset_job(load_job_name(app.application_id),
                               selection=dg.AssetSelection.assets(entity_raw_asset_key(app.application_id)),
                               description=f"One POST /load of the load API into "
                                           f"{entity_raw.table_identifier(app.application_id)}.",
                               tags={"lakehouse/application": app.application_id})


def entity_raw_definitions(catalog: MetadataCatalog) -> dict[str, list]:
    apps = entity_raw.registered(catalog)
    return {
        "assets": [_asset(catalog, a) for a in apps],
        "sensors": [_sensor(a, a.source_id) for a in apps if a.source_id],
        "jobs": [entity_raw_tables_job, *(_load_job(a) for a in apps)],
        "schedules": [entity_raw_tables_schedule],
    }
