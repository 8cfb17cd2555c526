"""The profile applied to real runs: tags at request time and re-tagging of queued runs.

Schedules and sensors call `request_tags` when they create a RunRequest; the throughput sensor
and `lakehouse profile set` call `retag_queued_runs`, so a profile switch reaches runs that are
already waiting in the queue (Dagster reads `dagster/priority` at dequeue time, and the run's
priority again when its steps claim pool slots).
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from lakehouse.metadata.assets import pipeline_of_run
from lakehouse.metadata.model import MetadataCatalog
from lakehouse.metadata.store import MetadataStore, audit_log
from lakehouse.throughput.profiles import (
    PIPELINE_TAG,
    PRIORITY_TAG,
    PROFILE_TAG,
    RESERVE_TAG,
    QueueLoad,
    RunInfo,
    run_info,
    tags_for,
)

if TYPE_CHECKING:
    import dagster as dg

log = logging.getLogger(__name__)


def expected_durations(store: MetadataStore, last_n: int = 20) -> dict[str, float]:
    """Median seconds per run of each pipeline, from the audit log's `published` events."""
    store.create_all()
    q = (
        sa.select(audit_log.c.pipeline_id, audit_log.c.run_id, sa.func.sum(audit_log.c.duration_ms))
        .where(audit_log.c.event == "published", audit_log.c.duration_ms.is_not(None))
        .group_by(audit_log.c.pipeline_id, audit_log.c.run_id)
        .order_by(sa.func.max(audit_log.c.id).desc())
        .limit(2000)
    )
    per: dict[str, list[float]] = defaultdict(list)
    with store.engine.connect() as conn:
        for pipeline_id, _run, ms in conn.execute(q):
            if pipeline_id and len(per[pipeline_id]) < last_n:
                per[pipeline_id].append(float(ms) / 1000.0)
    return {p: statistics.median(v) for p, v in per.items() if v}


def _active_runs(instance: dg.DagsterInstance):
    import dagster as dg

    statuses = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED]
    return instance.get_runs(filters=dg.RunsFilter(statuses=statuses))


def _infos(catalog: MetadataCatalog, runs, durations) -> dict[str, RunInfo]:
    known = {p.pipeline_id for p in catalog.pipelines}
    out = {}
    for r in runs:  # a UI "Materialize" of a pipeline's assets has no tag: it is known by its selection
        pid = pipeline_of_run(r.tags, [k.path for k in r.asset_selection or ()], catalog)
        if pid in known:
            out[r.run_id] = run_info(catalog, pid, durations)
    return out


def current_load(instance: dg.DagsterInstance, catalog: MetadataCatalog,
                 durations: dict[str, float] | None = None) -> QueueLoad:
    return QueueLoad.of(_infos(catalog, _active_runs(instance), durations or {}).values())


def request_tags(store: MetadataStore, pipeline_id: str, instance: dg.DagsterInstance | None = None) -> dict[str, str]:
    """Tags for a new run of `pipeline_id` under the profile active right now."""
    catalog = store.load()
    durations = expected_durations(store)
    load = current_load(instance, catalog, durations) if instance is not None else None
    return {PIPELINE_TAG: pipeline_id, **tags_for(catalog, run_info(catalog, pipeline_id, durations), load)}


@dataclass
class Retag:
    run_id: str
    pipeline_id: str
    old_priority: str | None
    new_priority: str
    profile: str


def retag_queued_runs(instance: dg.DagsterInstance, store: MetadataStore) -> list[Retag]:
    """Recompute profile tags of every QUEUED run of a known pipeline; write only the changes."""
    import dagster as dg

    catalog = store.load()
    durations = expected_durations(store)
    active = list(_active_runs(instance))
    infos = _infos(catalog, active, durations)
    load = QueueLoad.of(infos.values())
    changes: list[Retag] = []
    for r in active:
        if r.status != dg.DagsterRunStatus.QUEUED or r.run_id not in infos:
            continue
        info = infos[r.run_id]
        new = {PIPELINE_TAG: info.pipeline_id, **tags_for(catalog, info, load.without(info))}
        old_reserve = r.tags.get(RESERVE_TAG, "")
        if old_reserve.startswith("open:") and new[RESERVE_TAG].startswith("open:"):
            new[RESERVE_TAG] = old_reserve  # keep the unique value: nothing changed
        diff = {k: v for k, v in new.items() if r.tags.get(k) != v}
        if not diff:
            continue
        instance.add_run_tags(r.run_id, diff)
        changes.append(Retag(r.run_id, info.pipeline_id, r.tags.get(PRIORITY_TAG), new[PRIORITY_TAG],
                             new[PROFILE_TAG]))
    if changes:
        log.info("re-tagged %d queued run(s) for the current profiles", len(changes))
    return changes


def instance_of(context) -> dg.DagsterInstance | None:
    """The context's instance, or None for a context built without one (unit tests)."""
    try:
        return context.instance
    except Exception:  # dagster raises DagsterInvariantViolationError when there is none
        return None
