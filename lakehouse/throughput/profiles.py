"""Scheduling profiles: which runs go first, and what capacity critical work keeps for itself.

The profile of a pipeline is its `pipeline_profiles` row, else the global row (`pipeline_id: '*'`),
else `balanced`. Everything here is plain Python over the metadata catalog and a snapshot of the
queue load, so the platform (schedules, sensors, re-tagging) and the benchmark's simulator run the
SAME ordering code.

* focus: a run's `dagster/priority` is a large weight per criticality, so critical runs leave the
  queue first and their steps claim pool slots first (Dagster orders slot claims by run priority +
  op priority). Capacity is reserved through the run queue: every non-critical run carries
  `lakehouse/reserve-key = standard:<its first pool>`, and the instance limits runs per unique value
  of that tag (`run_queue.tag_concurrency_limits`, see deploy/dagster.dev.yaml), so lower-priority
  work can hold at most that many runs per source and the rest of the pool stays free for critical
  runs. Critical runs get a unique value, so the limit never binds them.
* balanced: criticality does not matter; the priority is "shortest expected run first" (which
  minimises mean latency) minus a penalty per run already queued or running on the same
  sources/targets (so idle sources are served before hot ones and no pool becomes a hotspot).
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from lakehouse.metadata.model import MetadataCatalog

PROFILES = ("balanced", "focus")
DEFAULT_PROFILE = "balanced"
GLOBAL = "*"

PRIORITY_TAG = "dagster/priority"
PROFILE_TAG = "lakehouse/profile"
RESERVE_TAG = "lakehouse/reserve-key"
PIPELINE_TAG = "lakehouse/pipeline"

CRITICALITY_RANK = {"critical": 3, "high": 2, "normal": 1, "low": 0}

#: profile_settings keys and their defaults; a `profile_settings` row overrides one value.
DEFAULT_SETTINGS: dict[str, dict[str, float]] = {
    "focus": {
        "priority_weight_critical": 1000,
        "priority_weight_high": 100,
        "priority_weight_normal": 10,
        "priority_weight_low": 0,
        # points per expected minute, a tie-breaker inside one criticality
        "duration_weight": 1,
    },
    "balanced": {
        "priority_weight_critical": 0,
        "priority_weight_high": 0,
        "priority_weight_normal": 0,
        "priority_weight_low": 0,
        "duration_weight": 10,
        "hotspot_penalty": 20,
    },
}
DEFAULT_DURATION_S = 60.0


def profile_settings(catalog: MetadataCatalog, profile: str) -> dict[str, float]:
    base = dict(DEFAULT_SETTINGS.get(profile, DEFAULT_SETTINGS[DEFAULT_PROFILE]))
    for s in catalog.profile_settings:
        if s.profile_id == profile:
            base[s.setting_key] = s.setting_value
    return base


def kind_of(catalog: MetadataCatalog, profile_id: str) -> str:
    """A custom profile id behaves like balanced or focus: its `mode` setting (0 balanced, 1 focus)."""
    if profile_id in PROFILES:
        return profile_id
    for s in catalog.profile_settings:
        if s.profile_id == profile_id and s.setting_key == "mode":
            return "focus" if s.setting_value >= 1 else "balanced"
    return DEFAULT_PROFILE


def active_profile(catalog: MetadataCatalog, pipeline_id: str | None = None) -> str:
    """Per-pipeline override, else the global ('*') row, else balanced."""
    by_pipeline = {pp.pipeline_id: pp.profile_id for pp in catalog.pipeline_profiles}
    if pipeline_id is not None and pipeline_id in by_pipeline:
        return by_pipeline[pipeline_id]
    return by_pipeline.get(GLOBAL, DEFAULT_PROFILE)


def pipeline_pools(catalog: MetadataCatalog, pipeline_id: str) -> list[str]:
    """Pools a pipeline's steps use, in stage order: source pools of ingesting stages, then targets."""
    sources = {s.source_id for s in catalog.sources}
    pools: list[str] = []
    for st in catalog.stages_of(pipeline_id):
        if st.source_id in sources and not st.transformation:
            pools.append(f"source:{st.source_id}")
    for st in catalog.stages_of(pipeline_id):
        pools.append(f"target:{st.target_id}")
    return list(dict.fromkeys(pools))


@dataclass(frozen=True)
class RunInfo:
    """What the ordering needs to know about one run (real or simulated)."""

    pipeline_id: str
    criticality: str = "normal"
    pools: tuple[str, ...] = ()
    expected_duration_s: float = DEFAULT_DURATION_S


@dataclass
class QueueLoad:
    """Runs queued or in progress per pool (excluding the run being prioritised)."""

    per_pool: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, runs: Iterable[RunInfo]) -> QueueLoad:
        c: Counter = Counter()
        for r in runs:
            c.update(set(r.pools))
        return cls(c)

    def without(self, run: RunInfo) -> QueueLoad:
        c = Counter(self.per_pool)
        c.subtract(set(run.pools))
        return QueueLoad(+c)


def priority(kind: str, settings: Mapping[str, float], run: RunInfo, load: QueueLoad | None = None) -> int:
    """The `dagster/priority` of a run (higher leaves the queue first)."""
    weight = settings.get(f"priority_weight_{run.criticality}", 0.0)
    minutes = max(run.expected_duration_s, 0.0) / 60.0
    p = weight - settings.get("duration_weight", 0.0) * minutes
    if kind == "balanced" and load is not None:
        busiest = max((load.per_pool.get(pool, 0) for pool in run.pools), default=0)
        p -= settings.get("hotspot_penalty", 0.0) * busiest
    return int(math.floor(p))


def reserve_key(kind: str, run: RunInfo) -> str:
    """Value of RESERVE_TAG: shared per source for lower-priority work under focus, unique otherwise."""
    if kind == "focus" and run.criticality != "critical" and run.pools:
        return f"standard:{run.pools[0]}"
    return f"open:{uuid.uuid4().hex[:12]}"


def run_info(catalog: MetadataCatalog, pipeline_id: str, durations: Mapping[str, float] | None = None) -> RunInfo:
    p = catalog.pipeline(pipeline_id)
    return RunInfo(pipeline_id, p.criticality, tuple(pipeline_pools(catalog, pipeline_id)),
                   (durations or {}).get(pipeline_id, DEFAULT_DURATION_S))


def tags_for(catalog: MetadataCatalog, run: RunInfo, load: QueueLoad | None = None) -> dict[str, str]:
    """Run tags for a run of this pipeline under its active profile, computed now."""
    profile_id = active_profile(catalog, run.pipeline_id)
    kind = kind_of(catalog, profile_id)
    settings = profile_settings(catalog, profile_id)
    return {
        PRIORITY_TAG: str(priority(kind, settings, run, load)),
        PROFILE_TAG: profile_id,
        RESERVE_TAG: reserve_key(kind, run),
    }


def op_priority(criticality: str) -> int:
    """Static op priority inside a run (added to the run priority when steps claim pool slots)."""
    return CRITICALITY_RANK.get(criticality, 1)
