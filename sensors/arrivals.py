"""File arrivals: ONE sensor for every ingesting stage whose source is a landing zone or an S3 prefix.

A tick is one evaluation for all sources: the metadata is loaded once, each source is polled
(listed) in a thread pool, and each keeps its own cursor inside the sensor's JSON cursor. New
files start a run of the ingesting stage and what follows it in its pipeline. A source that is
switched off, or whose listing fails, is skipped with its reason while the others go on.

What each source is doing is shown where an operator looks for it: on the source's asset
(`sources/<id>`) as an observation whenever its state changes (new files, nothing new, disabled,
error: with the reason and the files and runs it led to), in the tick's summary, and in the tags of
the runs it requests (`lakehouse/source`, `lakehouse/stage`). The listing, cursor and batching
logic lives in `lakehouse.ingest.arrivals`.

A run it requests is the platform's asset job (`factory.PIPELINES_JOB`) with those stages selected:
there is no job per pipeline, and the run worker builds that pipeline only
(lakehouse_assets/definitions.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg

from lakehouse.ingest.arrivals import ArrivalDecision
from lakehouse.ingest.s3 import ARRIVAL_TAG
from lakehouse.orchestration.queue import instance_of, request_tags
from lakehouse.settings import DagsterSettings, current
from lakehouse.sources.arrivals import poll_arrivals
from lakehouse.stage.runner import Platform
from lakehouse_assets.factory import PIPELINES_JOB, Graph, source_asset_key
from resources.lakehouse import LakehouseResource

SENSOR_NAME = "lakehouse_arrivals"
SOURCE_TAG = "lakehouse/source"
STAGE_TAG = "lakehouse/stage"


@dataclass(frozen=True)
class Watched:
    """One ingesting stage the sensor polls: its source, and what a run of new files materializes."""

    pipeline_id: str
    stage_name: str
    source_id: str
    selection: tuple[dg.AssetKey, ...]  # the stage and the stages after it in its pipeline

    @property
    def name(self) -> str:
        return f"{self.pipeline_id}.{self.stage_name}"


def watched_stages(g: Graph, pipelines: set[str] | None = None) -> list[Watched]:
    """Every stage (of `pipelines`, a code location's, when given) reading a files/s3 source directly,
    with its stage and what follows it in its pipeline (through the pipeline's own deps)."""
    out = []
    stages_of: dict[str, list] = {}
    for st in g.catalog.stages:
        stages_of.setdefault(st.pipeline_id, []).append(st)
    for st in g.catalog.stages:
        src = g.sources.get(st.source_id or "")
        if src is None or src.kind not in ("files", "s3") or st.transformation:
            continue
        if pipelines is not None and st.pipeline_id not in pipelines:
            continue
        keys = [g.key(st)]
        mine = {g.key(s): s for s in stages_of[st.pipeline_id]}
        grew = True
        while grew:  # downstream within the pipeline, in dependency order
            grew = False
            for k, s in mine.items():
                if k not in keys and any(d in keys for d in g.deps(s)):
                    keys.append(k)
                    grew = True
        out.append(Watched(st.pipeline_id, st.stage_name, src.source_id, tuple(keys)))
    return out


def poll_all(platform: Platform, watched: Sequence[Watched], cursors: dict[str, str],
             threads: int | None = None) -> dict[str, ArrivalDecision | Exception]:
    """Poll every watched stage's source in parallel, each from its own cursor; a failure is that
    source's result, never the tick's."""
    catalog = platform.catalog()  # once per tick, not once per source

    def one(w: Watched) -> ArrivalDecision | Exception:
        try:
            return poll_arrivals(platform, w.pipeline_id, w.stage_name, cursors.get(w.name), catalog)
        except Exception as exc:  # noqa: BLE001 - reported per source (observation, tick summary, log)
            return exc

    workers = threads or platform.settings.arrival_threads
    with ThreadPoolExecutor(max(1, min(workers, len(watched) or 1)), thread_name_prefix="arrivals") as pool:
        return dict(zip([w.name for w in watched], pool.map(one, watched), strict=True))


def _state(result: ArrivalDecision | Exception) -> tuple[str, str]:
    """(status, reason) of one source after a poll."""
    if isinstance(result, Exception):
        return "error", f"{type(result).__name__}: {result}"
    if result.batches:
        n = sum(len(b.files) for b in result.batches)
        return "new_files", f"{n} new file(s) in {len(result.batches)} run(s)"
    reason = result.skip_reason or "nothing new"
    return ("disabled" if "disabled" in reason else "idle"), reason


def evaluate(context: dg.SensorEvaluationContext, platform: Platform, watched: Sequence[Watched]) -> dg.SensorResult:
    """One tick over every watched source."""
    state = json.loads(context.cursor) if context.cursor else {}
    cursors: dict[str, str] = state.get("cursors", {})
    reported: dict[str, str] = state.get("reported", {})  # source -> digest of the state last observed
    results = poll_all(platform, watched, cursors)
    requests: list[dg.RunRequest] = []
    observations: list[dg.AssetObservation] = []
    counts: dict[str, int] = {}
    errors: list[str] = []
    now = datetime.now(UTC).isoformat(timespec="seconds")
    instance = instance_of(context)
    for w in watched:
        res = results[w.name]
        status, reason = _state(res)
        counts[status] = counts.get(status, 0) + 1
        if isinstance(res, Exception):
            errors.append(f"{w.name} ({w.source_id}): {reason}")
            context.log.error(f"arrivals of {w.name}: listing source {w.source_id!r} failed: {reason}")
        else:
            if res.cursor is not None:
                cursors[w.name] = res.cursor
            tags = {"lakehouse/pipeline": w.pipeline_id, STAGE_TAG: w.stage_name, SOURCE_TAG: w.source_id}
            for b in res.batches:
                requests.append(dg.RunRequest(
                    run_key=b.run_key, job_name=PIPELINES_JOB, asset_selection=list(w.selection),
                    tags={**request_tags(platform.store, w.pipeline_id, instance), **tags,
                          "lakehouse/files": str(len(b.files)), ARRIVAL_TAG: b.run_key, **res.tags}))
        digest = hashlib.sha256(f"{status}|{reason}".encode()).hexdigest()[:16]
        if status == "new_files" or reported.get(w.name) != digest:  # a change of state is worth an event
            reported[w.name] = digest
            observations.append(dg.AssetObservation(
                asset_key=source_asset_key(w.source_id),
                description=f"arrivals for stage {w.name}: {status}",
                metadata={"status": status, "reason": reason, "stage": w.name, "polled_at": now,
                          "runs_requested": sum(1 for r in requests if r.tags.get(STAGE_TAG) == w.stage_name
                                                and r.tags.get("lakehouse/pipeline") == w.pipeline_id),
                          **({"files": sum(len(b.files) for b in res.batches)}
                             if not isinstance(res, Exception) else {})}))
    for gone in set(cursors) - {w.name for w in watched}:  # a stage no longer watched keeps no cursor
        cursors.pop(gone, None)
        reported.pop(gone, None)
    context.update_cursor(json.dumps({"cursors": cursors, "reported": reported}, sort_keys=True))
    summary = f"{len(watched)} source(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    disabled = [f"{w.name}: {_state(results[w.name])[1]}" for w in watched if _state(results[w.name])[0] == "disabled"]
    if disabled and not requests:  # why nothing started: the kill switch, with its reason
        summary += "; disabled: " + "; ".join(disabled[:5]) + (f" … ({len(disabled)} in all)" if len(disabled) > 5 else "")
    if errors:
        summary += "; errors: " + "; ".join(errors[:5]) + (f" … ({len(errors)} in all)" if len(errors) > 5 else "")
    if errors and not requests and len(errors) == len(watched):
        raise RuntimeError(f"every source's listing failed: {summary}")  # a failed tick, in red in the UI
    return dg.SensorResult(run_requests=requests, skip_reason=None if requests else summary,
                           asset_events=observations)


def build_arrival_sensor(g: Graph, pipelines: set[str] | None = None) -> dg.SensorDefinition | None:
    """The one arrival sensor (of a code location: of its `pipelines`), targeting the asset job (each run
    selects its stages); None when no stage reads files."""
    watched = watched_stages(g, pipelines)
    if not watched:
        return None

    @dg.sensor(
        name=SENSOR_NAME,
        description=f"New files in the {len(watched)} landing zone / S3 source(s) of ingesting stages start their "
                    "pipeline from that stage. One evaluation per tick for all of them; per-source state on each "
                    "source asset (`sources/<id>`) and in this sensor's tick history.",
        job_name=PIPELINES_JOB,
        minimum_interval_seconds=current(DagsterSettings).arrivals_interval,
        default_status=dg.DefaultSensorStatus.STOPPED,
    )
    def arrivals(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
        return evaluate(context, lakehouse.platform(), watched)

    return arrivals
