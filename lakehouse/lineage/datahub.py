"""DataHub emission with acryl-datahub: datasets + schemas, lineage with column-level lineage
(FineGrainedLineage), pipelines/stages as DataFlow/DataJob, each SQL stage's statement as a Query
entity linked to its datasets (and named by the lineage edges it makes), stage runs as
DataProcessInstance, validation rules and results as assertions.

Delivery never fails a data run. With DATAHUB_GMS_URL set, every batch of proposals is first
written to a durable spool on disk (a metadata file per batch, written atomically), then sent
with the real DatahubRestEmitter; a batch is deleted only after GMS accepted it. Batches that
could not be delivered stay and are retried, oldest first, before the next batch and by
`lakehouse datahub replay`. Without a GMS, the batches are written to
`$LAKEHOUSE_HOME/datahub/mcps/` in the file format `datahub check metadata-file` accepts and
`datahub ingest mcps FILE` replays.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datahub.emitter import mce_builder as builder
from datahub.emitter.mcp import MetadataChangeProposalWrapper
from datahub.metadata import schema_classes as m

from lakehouse.lineage.graph import STAGE_PREFIX, Derived, edges_into
from lakehouse.metadata.model import MetadataCatalog, Rule, Source, Stage, Target
from lakehouse.settings import DataHubSettings, current, named_secret
from lakehouse.sources import adapter_for
from lakehouse.sources.jdbc import jdbc_platform

if TYPE_CHECKING:
    from lakehouse.platform import Platform
    from lakehouse.stage.core import ExtractPlan, StageContext, StageOutcome

log = logging.getLogger(__name__)

ENV = DataHubSettings().datahub_env  # the fabric of every URN (LAKEHOUSE_DATAHUB_ENV), fixed per process
ORCHESTRATOR = "dagster"
SPOOL_SUFFIX = ".json"

# --------------------------------------------------------------------------- URNs


def source_urn(src: Source) -> str:
    """The source's dataset in DataHub: platform and name come from its adapter (lakehouse.sources)."""
    platform, name = adapter_for(src.kind).dataset_name(src)
    return builder.make_dataset_urn(platform, name, ENV)


def target_urn(t: Target) -> str:
    if t.kind == "iceberg":
        return builder.make_dataset_urn("iceberg", t.identifier.lower(), ENV)
    url = (named_secret(t.jdbc_url_env) or t.jdbc_url) if t.jdbc_url_env else t.jdbc_url
    name = ".".join(p for p in (t.warehouse_schema, t.warehouse_table) if p).lower()
    return builder.make_dataset_urn(jdbc_platform(url), name, ENV)


def dataset_urn(catalog: MetadataCatalog, dataset_id: str) -> str | None:
    t = next((x for x in catalog.targets if x.target_id == dataset_id), None)
    if t is not None:
        return target_urn(t)
    s = next((x for x in catalog.sources if x.source_id == dataset_id), None)
    return source_urn(s) if s is not None else None


def flow_urn(pipeline_id: str) -> str:
    return builder.make_data_flow_urn(ORCHESTRATOR, pipeline_id, ENV)


def job_urn(stage: Stage) -> str:
    return builder.make_data_job_urn_with_flow(flow_urn(stage.pipeline_id), stage.stage_name)


def query_urn(stage: Stage) -> str:
    """One Query entity per SQL stage: stable across runs, so each run updates the same query."""
    from datahub.metadata.urns import QueryUrn

    return QueryUrn(builder.datahub_guid(
        {"platform": "lakehouse", "pipeline": stage.pipeline_id, "stage": stage.stage_name, "kind": "query"})).urn()


def assertion_urn(stage: Stage, rule: Rule) -> str:
    return builder.make_assertion_urn(builder.datahub_guid(
        {"platform": "lakehouse", "pipeline": stage.pipeline_id, "stage": stage.stage_name, "rule": rule.name}))


# --------------------------------------------------------------------------- schemas


def _field_type(spark_type: str) -> m.SchemaFieldDataTypeClass:
    t = spark_type.lower()
    if t.startswith(("struct", "row")):
        cls: Any = m.RecordTypeClass()
    elif t.startswith(("array", "list")):
        cls = m.ArrayTypeClass()
    elif t.startswith("map"):
        cls = m.MapTypeClass()
    elif t in ("boolean", "bool"):
        cls = m.BooleanTypeClass()
    elif t.startswith(("timestamp", "time")):
        cls = m.TimeTypeClass()
    elif t == "date":
        cls = m.DateTypeClass()
    elif t.startswith(("int", "bigint", "long", "smallint", "tinyint", "double", "float", "decimal", "short")):
        cls = m.NumberTypeClass()
    elif t in ("binary", "fixed") or t.startswith("fixed"):
        cls = m.BytesTypeClass()
    else:
        cls = m.StringTypeClass()
    return m.SchemaFieldDataTypeClass(type=cls)


def schema_aspect(name: str, platform: str, columns: list[tuple[str, str, bool]]) -> m.SchemaMetadataClass:
    return m.SchemaMetadataClass(
        schemaName=name, platform=builder.make_data_platform_urn(platform), version=0, hash="",
        platformSchema=m.OtherSchemaClass(rawSchema=""),
        fields=[m.SchemaFieldClass(fieldPath=c, type=_field_type(t), nativeDataType=t, nullable=n)
                for c, t, n in columns],
    )


def iceberg_columns(platform: Platform, identifier: str) -> list[tuple[str, str, bool]]:
    """(name, type, nullable) of an Iceberg table, read with PyIceberg (no Spark job)."""
    try:
        schema = platform.pyiceberg_catalog().load_table(identifier).schema()
    except Exception:
        return []
    return [(f.name, str(f.field_type), not f.required) for f in schema.fields]


# --------------------------------------------------------------------------- proposals


def _mcp(urn: str, aspect) -> MetadataChangeProposalWrapper:
    return MetadataChangeProposalWrapper(entityUrn=urn, aspect=aspect)


def dataset_mcps(platform: Platform | None, catalog: MetadataCatalog, dataset_id: str,
                 schema_columns: list[tuple[str, str, bool]] | None = None, *,
                 lineage: bool = True) -> list[MetadataChangeProposalWrapper]:
    """Properties, subtype, schema and (unless `lineage` is false: a run emits its own) upstream
    lineage with column lineage of one dataset."""
    urn = dataset_urn(catalog, dataset_id)
    if urn is None:
        return []
    out = []
    t = next((x for x in catalog.targets if x.target_id == dataset_id), None)
    s = next((x for x in catalog.sources if x.source_id == dataset_id), None)
    platform_name = urn.split("dataPlatform:", 1)[1].split(",", 1)[0]
    if t is not None:
        props = {"target_id": t.target_id, "kind": t.kind, "write_mode": t.write_mode}
        if t.kind == "iceberg":
            props["partition_spec"] = ", ".join(f"{p.transform}({p.column})" for p in t.partition_spec)
        st = catalog.stage_for_target(t.target_id)
        if st is not None:
            props.update(layer=st.layer, pipeline=st.pipeline_id, stage=st.stage_name)
        out.append(_mcp(urn, m.DatasetPropertiesClass(
            name=t.identifier if t.kind == "iceberg" else (t.warehouse_table or t.target_id),
            description=t.description or None, customProperties={k: v for k, v in props.items() if v})))
        out.append(_mcp(urn, m.SubTypesClass(typeNames=["Table"])))
        cols = schema_columns
        if cols is None and t.kind == "iceberg" and platform is not None:
            cols = iceberg_columns(platform, t.identifier)
        if cols:
            out.append(_mcp(urn, schema_aspect(t.identifier if t.kind == "iceberg" else t.target_id,
                                               platform_name, cols)))
    elif s is not None:
        where = s.path or (f"s3://{s.bucket}/{s.prefix}" if s.bucket else s.table or s.table_identifier or "query")
        props = {"source_id": s.source_id, "kind": s.kind, "location": where, "format": s.format or ""}
        if s.alternative_source_id:
            props["alternative_source_id"] = s.alternative_source_id
        out.append(_mcp(urn, m.DatasetPropertiesClass(name=s.source_id, description=s.description or None,
                                                      customProperties={k: v for k, v in props.items() if v})))
        out.append(_mcp(urn, m.SubTypesClass(typeNames=[adapter_for(s.kind).subtype])))
        cols = schema_columns or [(c.name, c.type, c.nullable) for c in s.columns]
        if cols:
            out.append(_mcp(urn, schema_aspect(s.source_id, platform_name, cols)))
    up = upstream_lineage(catalog, dataset_id) if lineage else None
    if up is not None:
        out.append(_mcp(urn, up))
    return out


def fine_grained(catalog: MetadataCatalog, edges) -> list[m.FineGrainedLineageClass]:
    out = []
    for e in edges:
        up_urn, down_urn = dataset_urn(catalog, e.from_dataset_id), dataset_urn(catalog, e.to_dataset_id)
        if not (up_urn and down_urn):
            continue
        for col, sources in sorted(e.column_lineage.items()):
            if not sources:
                continue
            out.append(m.FineGrainedLineageClass(
                upstreamType=m.FineGrainedLineageUpstreamTypeClass.FIELD_SET,
                upstreams=[builder.make_schema_field_urn(up_urn, c) for c in sources],
                downstreamType=m.FineGrainedLineageDownstreamTypeClass.FIELD,
                downstreams=[builder.make_schema_field_urn(down_urn, col)],
                transformOperation=e.transform_name or None, query=_edge_query(catalog, e),
            ))
    return out


def _edge_query(catalog: MetadataCatalog, e) -> str | None:
    """The Query entity of the SQL stage an edge comes from (`stage:<pipeline>.<stage>`), if any."""
    st = catalog.stage_for_target(e.to_dataset_id)
    if st is None or not st.transformation or e.transform_name != f"{STAGE_PREFIX}{st.pipeline_id}.{st.stage_name}":
        return None
    return query_urn(st)


def upstream_lineage(catalog: MetadataCatalog, dataset_id: str, used_upstream: str | None = None,
                     derived: Derived | None = None) -> m.UpstreamLineageClass | None:
    """The default routes into a dataset (plus the upstream a rerouted run actually read); an edge
    made by a SQL stage names that stage's Query entity. `derived`: as for `edges_into`."""
    edges = [e for e in edges_into(catalog, dataset_id, derived)
             if e.is_default or e.from_dataset_id == used_upstream]
    ups = []
    for e in edges:
        u = dataset_urn(catalog, e.from_dataset_id)
        if u:
            ups.append(m.UpstreamClass(dataset=u, type=m.DatasetLineageTypeClass.TRANSFORMED,
                                       query=_edge_query(catalog, e)))
    if not ups:
        return None
    return m.UpstreamLineageClass(upstreams=ups, fineGrainedLineages=fine_grained(catalog, edges) or None)


def query_mcps(catalog: MetadataCatalog, stage: Stage,
               derived: Derived | None = None) -> list[MetadataChangeProposalWrapper]:
    """A SQL stage's statement as a DataHub Query entity (queryProperties, querySubjects) linked to
    the datasets it reads and writes, with the stage's DataJob as its origin."""
    if not stage.transformation:
        return []
    from lakehouse.lineage.graph import stage_upstreams

    ups = stage_upstreams(catalog, stage, (derived or {}).get((stage.pipeline_id, stage.stage_name)))
    subjects = [u for u in (dataset_urn(catalog, d) for d in [*ups, stage.target_id]) if u]
    stamp = m.AuditStampClass(time=int(time.time() * 1000), actor=builder.make_user_urn("lakehouse"))
    props = m.QueryPropertiesClass(
        statement=m.QueryStatementClass(value=stage.transformation.strip(), language=m.QueryLanguageClass.SQL),
        source=m.QuerySourceClass.MANUAL, name=f"{stage.pipeline_id}.{stage.stage_name}",
        description=stage.description or None, created=stamp, lastModified=stamp, origin=job_urn(stage),
        customProperties={"pipeline": stage.pipeline_id, "stage": stage.stage_name, "layer": stage.layer})
    # (datahub.sql_parsing's make_query_subjects does the same, but importing it needs the sqlparse extra)
    links = m.QuerySubjectsClass(subjects=[m.QuerySubjectClass(entity=u) for u in subjects])
    return list(MetadataChangeProposalWrapper.construct_many(query_urn(stage), aspects=[props, links]))


def flow_mcps(catalog: MetadataCatalog, pipeline_id: str) -> list[MetadataChangeProposalWrapper]:
    from datahub.api.entities.datajob import DataFlow

    p = catalog.pipeline(pipeline_id)
    props = {"criticality": p.criticality, "schedule": p.schedule or "", "enabled": str(p.enabled).lower()}
    flow = DataFlow(orchestrator=ORCHESTRATOR, id=pipeline_id, env=ENV, name=pipeline_id,
                    description=p.description or None, properties={k: v for k, v in props.items() if v})
    return list(flow.generate_mcp())


def _datajob(catalog: MetadataCatalog, stage: Stage, used_upstream: str | None = None,
             derived: Derived | None = None):
    from datahub.api.entities.datajob import DataJob
    from datahub.utilities.urns.data_flow_urn import DataFlowUrn
    from datahub.utilities.urns.dataset_urn import DatasetUrn

    edges = [e for e in edges_into(catalog, stage.target_id, derived)
             if e.is_default or e.from_dataset_id == used_upstream]
    inlets = [dataset_urn(catalog, e.from_dataset_id) for e in edges]
    out = dataset_urn(catalog, stage.target_id)
    return DataJob(
        id=stage.stage_name, flow_urn=DataFlowUrn.from_string(flow_urn(stage.pipeline_id)), name=stage.stage_name,
        description=stage.description or None,
        properties={"layer": stage.layer, "stage_order": str(stage.stage_order), "target_id": stage.target_id,
                    **({"transformation": stage.transformation.strip()} if stage.transformation else {})},
        inlets=[DatasetUrn.from_string(u) for u in inlets if u],
        outlets=[DatasetUrn.from_string(out)] if out else [],
        fine_grained_lineages=fine_grained(catalog, edges),
    )


def job_mcps(catalog: MetadataCatalog, stage: Stage) -> list[MetadataChangeProposalWrapper]:
    return list(_datajob(catalog, stage).generate_mcp(materialize_iolets=False))


def assertion_info_mcps(catalog: MetadataCatalog, stage: Stage) -> list[MetadataChangeProposalWrapper]:
    if not stage.validation_set_id:
        return []
    ds = dataset_urn(catalog, stage.target_id)
    out = []
    for rule in catalog.rule_set(stage.validation_set_id).rules:
        cols = rule.columns or ([rule.column] if rule.column else [])
        scope = m.DatasetAssertionScopeClass.DATASET_COLUMN if cols else m.DatasetAssertionScopeClass.DATASET_ROWS
        try:
            from lakehouse.validation.rules import describe

            logic = describe(rule)
        except Exception:
            logic = rule.expression or rule.type
        info = m.AssertionInfoClass(
            type=m.AssertionTypeClass.DATASET,
            datasetAssertion=m.DatasetAssertionInfoClass(
                dataset=ds, scope=scope, operator=m.AssertionStdOperatorClass._NATIVE_, nativeType=rule.type,
                fields=[builder.make_schema_field_urn(ds, c) for c in cols] or None, logic=str(logic),
                nativeParameters={"severity": rule.severity, "action": rule.action, "enabled": str(rule.enabled)},
            ),
            description=rule.description or f"{rule.name}: {rule.type} ({rule.severity})",
            customProperties={"rule": rule.name, "rule_set": stage.validation_set_id},
        )
        out.append(_mcp(assertion_urn(stage, rule), info))
    return out


def assertion_result_mcp(stage: Stage, ds_urn: str, rule: Rule, passed: bool, run_id: str, ts_ms: int,
                         failed_rows: int | None = None, total_rows: int | None = None,
                         message: str | None = None) -> MetadataChangeProposalWrapper:
    result = m.AssertionResultClass(
        type=m.AssertionResultTypeClass.SUCCESS if passed else m.AssertionResultTypeClass.FAILURE,
        rowCount=total_rows, unexpectedCount=failed_rows,
        nativeResults={k: str(v) for k, v in {"message": message, "severity": rule.severity}.items() if v},
    )
    return _mcp(assertion_urn(stage, rule), m.AssertionRunEventClass(
        timestampMillis=ts_ms, runId=run_id, asserteeUrn=ds_urn, assertionUrn=assertion_urn(stage, rule),
        status=m.AssertionRunStatusClass.COMPLETE, result=result))


def catalog_mcps(platform: Platform | None, catalog: MetadataCatalog) -> list[MetadataChangeProposalWrapper]:
    """Everything the metadata describes: datasets, flows, jobs and assertion definitions."""
    out: list[MetadataChangeProposalWrapper] = []
    for s in catalog.sources:
        out.extend(dataset_mcps(platform, catalog, s.source_id))
    for t in catalog.targets:
        out.extend(dataset_mcps(platform, catalog, t.target_id))
    for p in catalog.pipelines:
        out.extend(flow_mcps(catalog, p.pipeline_id))
    for st in catalog.stages:
        out.extend(job_mcps(catalog, st))
        out.extend(query_mcps(catalog, st))
        out.extend(assertion_info_mcps(catalog, st))
    return out


def history_mcps(platform: Platform, catalog: MetadataCatalog, limit: int = 10_000) -> list[MetadataChangeProposalWrapper]:
    """Assertion results from the check history (lakehouse.validation.history.check_history)."""
    from lakehouse.validation.history import check_history

    out = []
    for h in reversed(check_history(platform.store, limit=limit)):  # oldest first
        try:
            st = catalog.stage(h["pipeline_id"] or "", h["stage_name"] or "")
            rule = next(r for r in catalog.rule_set(st.validation_set_id).rules if r.name == h["rule"])
        except (KeyError, StopIteration):
            continue  # a rule or stage that no longer exists
        ts = h["ts"]
        out.append(assertion_result_mcp(st, dataset_urn(catalog, st.target_id), rule, h["passed"],
                                        h["run_id"] or "unknown",
                                        int(ts.timestamp() * 1000) if ts else int(time.time() * 1000),
                                        h["failed_rows"], h["total_rows"], h["message"]))
    return out


def run_mcps(runner: StageContext, outcome: StageOutcome | None, *, success: bool, started_ms: int,
             used_upstream: str | None = None, checks=None) -> list[MetadataChangeProposalWrapper]:
    """One stage run: the target's schema and lineage, the job, its DataProcessInstance, check results.
    A SQL stage's lineage comes from what apply stored for it when that is up to date (no SQL parsed)."""
    catalog, st = runner.catalog, runner.stage
    derived = runner.stored_derivation()
    now = int(time.time() * 1000)
    out: list[MetadataChangeProposalWrapper] = []
    out.extend(flow_mcps(catalog, st.pipeline_id))
    for up in {e.from_dataset_id for e in edges_into(catalog, st.target_id, derived)}:
        if up == used_upstream or catalog.stage_for_target(up) is None:
            out.extend(dataset_mcps(runner.platform, catalog, up))
    out.extend(dataset_mcps(runner.platform, catalog, st.target_id, lineage=False))
    lineage = upstream_lineage(catalog, st.target_id, used_upstream, derived)
    if lineage is not None:
        out.append(_mcp(dataset_urn(catalog, st.target_id), lineage))
    job = _datajob(catalog, st, used_upstream, derived)
    out.extend(job.generate_mcp(materialize_iolets=False))
    out.extend(query_mcps(catalog, st, derived))
    out.extend(assertion_info_mcps(catalog, st))
    props = {"run_id": runner.run_id, "pipeline": st.pipeline_id, "stage": st.stage_name}
    if outcome is not None:
        props.update(rows_written=str(outcome.rows_written), published=str(outcome.published).lower(),
                     snapshot_id=str(outcome.snapshot_id))
    if used_upstream and used_upstream != st.source_id:
        props["rerouted_from"] = st.source_id or ""
        props["rerouted_to"] = used_upstream
    out.extend(instance_mcps(job, f"{runner.run_id}.{st.stage_name}", props, started_ms, now, success))
    target_urn_ = dataset_urn(catalog, st.target_id)
    for c in checks if checks is not None else (outcome.checks if outcome else []):
        out.append(assertion_result_mcp(st, target_urn_, c.rule, c.passed, runner.run_id, now,
                                        c.failed_rows, c.total_rows, c.message))
    return out


def instance_mcps(job, instance_id: str, properties: dict[str, str], started_ms: int, ended_ms: int,
                  success: bool) -> list[MetadataChangeProposalWrapper]:
    """One run of `job` (a DataJob) as DataHub's DataProcessInstance aspects: what
    `DataProcessInstance.from_datajob(job, id, clone_inlets=True, clone_outlets=True)` generates
    with `generate_mcp(materialize_iolets=False)`, `start_event_mcp` and `end_event_mcp`, aspect for
    aspect (tests/test_datahub_instance.py compares them). Built from the schema classes because
    that helper's module imports acryl-datahub's ingestion framework, REST emitter and telemetry
    (~0.5 s of CPU), which a run that writes a metadata file never uses. This module's DataJobs
    name no platform instance, so there is no DataPlatformInstance aspect."""
    key = {"cluster": job.flow_urn.cluster, "orchestrator": job.flow_urn.orchestrator, "id": instance_id}
    urn = f"urn:li:dataProcessInstance:{builder.datahub_guid({k: v for k, v in key.items() if v is not None})}"
    aspects: list = [
        m.DataProcessInstancePropertiesClass(
            name=instance_id, created=m.AuditStampClass(time=started_ms, actor="urn:li:corpuser:datahub"),
            type=m.DataProcessTypeClass.BATCH_SCHEDULED, customProperties=properties, externalUrl=None),
        m.DataProcessInstanceRelationshipsClass(upstreamInstances=[], parentTemplate=str(job.urn), parentInstance=None),
    ]
    if job.inlets:
        aspects.append(m.DataProcessInstanceInputClass(inputs=[str(u) for u in job.inlets]))
    if job.outlets:
        aspects.append(m.DataProcessInstanceOutputClass(outputs=[str(u) for u in job.outlets]))
    aspects.append(m.DataProcessInstanceRunEventClass(status=m.DataProcessRunStatusClass.STARTED,
                                                      timestampMillis=started_ms, attempt=None))
    aspects.append(m.DataProcessInstanceRunEventClass(
        status=m.DataProcessRunStatusClass.COMPLETE, timestampMillis=ended_ms,
        result=m.DataProcessInstanceRunResultClass(
            type=m.RunResultTypeClass.SUCCESS if success else m.RunResultTypeClass.FAILURE,
            nativeResultType=job.flow_urn.orchestrator),
        attempt=None, durationMillis=(ended_ms - started_ms) if started_ms else None))
    return [_mcp(urn, a) for a in aspects]


# --------------------------------------------------------------------------- delivery


@dataclass
class EmitResult:
    written: int = 0
    delivered: int = 0
    pending: int = 0
    file: Path | None = None
    error: str | None = None

    def summary(self) -> str:
        if self.file is not None:
            return f"wrote {self.written} proposal(s) to {self.file}"
        text = f"delivered {self.delivered} proposal(s); {self.pending} waiting in the spool"
        return text + (f" (last error: {self.error})" if self.error else "")


def datahub_dir(platform: Platform) -> Path:
    return Path(platform.settings.home) / "datahub"


def spool_dir(platform: Platform) -> Path:
    return datahub_dir(platform) / "spool"


def gms_url(platform: Platform) -> str | None:
    return platform.settings.datahub_gms_url or current(DataHubSettings).datahub_gms_url or None


def _token(platform: Platform) -> str | None:
    token = platform.settings.datahub_gms_token or current(DataHubSettings).datahub_gms_token
    return token.get_secret_value() if token is not None else None


def write_mcp_file(path: Path, mcps: Iterable) -> int:
    """Atomically write proposals in the metadata-file format (`datahub check metadata-file`)."""
    items = list(mcps)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}.tmp")
    tmp.write_text(metadata_file_text(items))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return len(items)


def metadata_file_text(items: list) -> str:
    """The text `datahub.ingestion.sink.file.write_metadata_file` writes for these proposals, byte
    for byte (tests/test_datahub_instance.py), without importing that module: it pulls in the
    ingestion framework, the REST emitter and telemetry (~0.5 s of CPU per `lakehouse run`)."""
    objs = [x if isinstance(x, dict) else x.to_obj(simplified_structure=True) for x in items]
    return "[\n" + ",\n".join(json.dumps(o, indent=4) for o in objs) + "\n]"


def read_mcp_file(path: Path) -> list:
    from datahub.ingestion.source.file import read_metadata_file

    return list(read_metadata_file(path))


def _emitter(url: str, token: str | None):
    from datahub.emitter.rest_emitter import DatahubRestEmitter

    # short timeouts and one retry: an outage must cost a run seconds, not minutes (the spool retries)
    return DatahubRestEmitter(gms_server=url, token=token, connect_timeout_sec=2, read_timeout_sec=15,
                              retry_max_times=1)


@contextmanager
def _spool_lock(platform: Platform):
    d = spool_dir(platform)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield d
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pending_batches(platform: Platform) -> list[Path]:
    d = spool_dir(platform)
    return sorted(p for p in d.glob(f"*{SPOOL_SUFFIX}") if not p.name.startswith(".")) if d.exists() else []


def replay(platform: Platform, server: str | None = None) -> EmitResult:
    """Deliver spooled batches oldest first; stop at the first failure (order is kept)."""
    url = server or gms_url(platform)
    res = EmitResult()
    if not url:
        res.pending = sum(len(read_mcp_file(p)) for p in pending_batches(platform))
        res.error = "no DataHub GMS configured (DATAHUB_GMS_URL)"
        return res
    with _spool_lock(platform):
        batches = pending_batches(platform)
        emitter = None
        for i, path in enumerate(batches):
            items = read_mcp_file(path)
            try:
                emitter = emitter or _emitter(url, _token(platform))
                emitter.emit_mcps(items)
            except Exception as exc:
                res.error = f"{type(exc).__name__}: {str(exc)[:300]}"
                res.pending = sum(len(read_mcp_file(p)) for p in batches[i:])
                log.warning("DataHub at %s unavailable (%s); %d proposal(s) kept in %s",
                            url, res.error, res.pending, spool_dir(platform))
                break
            path.unlink()
            res.delivered += len(items)
        if emitter is not None:
            emitter.close()
    return res


def emit(platform: Platform, mcps: list, label: str) -> EmitResult:
    """Spool + deliver (GMS configured) or write a metadata file (no GMS). Never raises."""
    stamp = f"{time.time_ns():020d}-{_safe(label)}"
    try:
        if not gms_url(platform):
            path = datahub_dir(platform) / "mcps" / f"{stamp}.json"
            return EmitResult(written=write_mcp_file(path, mcps), file=path)
        write_mcp_file(spool_dir(platform) / f"{stamp}{SPOOL_SUFFIX}", mcps)
        res = replay(platform)
        res.written = len(mcps)
        return res
    except Exception as exc:  # lineage is never worth a failed data run
        log.warning("DataHub emission of %s failed: %s", label, exc, exc_info=True)
        return EmitResult(error=str(exc))


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:100]


def emit_catalog(platform: Platform, output: str | None = None) -> EmitResult:
    """`lakehouse datahub emit`: the whole catalog plus assertion results from the check history."""
    catalog = platform.catalog()
    mcps = catalog_mcps(platform, catalog) + history_mcps(platform, catalog)
    if output:
        path = Path(output)
        return EmitResult(written=write_mcp_file(path, mcps), file=path)
    return emit(platform, mcps, "catalog")


def emit_stage_run(runner: StageContext, plan: ExtractPlan | None, outcome: StageOutcome | None, *,
                   success: bool, started_ms: int | None = None, checks=None) -> EmitResult:
    """Called by the runner after publish (and on a failed audit); never raises."""
    try:
        if not current(DataHubSettings).datahub:  # LAKEHOUSE_DATAHUB=off, read when a stage emits
            return EmitResult()
        dur = int((outcome.duration_s if outcome else 0) * 1000)
        started = started_ms or int(time.time() * 1000) - dur
        used = plan.source_id if plan is not None else None
        mcps = run_mcps(runner, outcome, success=success, started_ms=started, used_upstream=used, checks=checks)
        return emit(runner.platform, mcps, f"{runner.run_id}-{runner.stage.pipeline_id}-{runner.stage.stage_name}")
    except Exception as exc:
        log.warning("DataHub emission for %s.%s failed: %s", runner.stage.pipeline_id, runner.stage.stage_name,
                    exc, exc_info=True)
        return EmitResult(error=str(exc))


def status(platform: Platform) -> str:
    url = gms_url(platform)
    batches = pending_batches(platform)
    n = sum(len(read_mcp_file(p)) for p in batches)
    where = f"GMS {url}" if url else f"files under {datahub_dir(platform) / 'mcps'} (no DATAHUB_GMS_URL)"
    return f"DataHub target: {where}; spool: {len(batches)} batch(es), {n} proposal(s) waiting"


def to_json(mcps: list) -> str:
    return json.dumps([x.to_obj() for x in mcps], indent=1)
