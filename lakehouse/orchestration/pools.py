"""Dagster pool limits from `throttles` metadata (metric max_concurrent).

Metadata is the source of truth: `sync_pools` sets every `source:<id>` / `target:<id>` pool that
has a max_concurrent throttle to its threshold and deletes such pools whose throttle is gone (a
deleted pool falls back to the instance's `concurrency.pools.default_limit` the next time a step
claims it). Pools outside those two prefixes belong to someone else and are never touched.
It runs on `lakehouse metadata apply`, from the throughput sensor and from `lakehouse pools sync`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lakehouse.metadata.model import MetadataCatalog

if TYPE_CHECKING:
    import dagster as dg


log = logging.getLogger(__name__)
MANAGED_PREFIXES = ("source:", "target:")


@dataclass
class PoolSync:
    set: dict[str, int] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    unchanged: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.set or self.deleted)

    def summary(self) -> str:
        parts = [f"set {k}={v}" for k, v in sorted(self.set.items())]
        parts += [f"deleted {k}" for k in self.deleted]
        return ", ".join(parts) or f"{len(self.unchanged)} pool(s) already in sync"


def desired_limits(catalog: MetadataCatalog) -> dict[str, int]:
    """pool name -> slots; several max_concurrent throttles on one entity: the smallest wins."""
    out: dict[str, int] = {}
    for th in catalog.throttles:
        if th.metric != "max_concurrent":
            continue
        slots = max(1, math.floor(th.threshold))
        out[th.pool] = min(slots, out.get(th.pool, slots))
    return out


def current_limits(instance: dg.DagsterInstance) -> dict[str, tuple[int, bool]]:
    """pool -> (limit, from_default) as the instance stores it."""
    return {p.name: (p.limit, p.from_default) for p in instance.event_log_storage.get_pool_limits()}


def sync_instance(instance: dg.DagsterInstance, catalog: MetadataCatalog) -> PoolSync:
    desired = desired_limits(catalog)
    current = current_limits(instance)
    result = PoolSync()
    storage = instance.event_log_storage
    for name, limit in sorted(desired.items()):
        have = current.get(name)
        if have is not None and have[0] == limit and not have[1]:
            result.unchanged[name] = limit
            continue
        storage.set_concurrency_slots(name, limit)
        result.set[name] = limit
    for name, (_limit, from_default) in sorted(current.items()):
        if name.startswith(MANAGED_PREFIXES) and name not in desired and not from_default:
            storage.delete_concurrency_limit(name)
            result.deleted.append(name)
    if result.changed:
        log.info("pools synced from throttles: %s", result.summary())
    return result


def unenforced(catalog: MetadataCatalog, instance: dg.DagsterInstance | None, why: str | None = None) -> list[str]:
    """A line per max_concurrent throttle that the instance will not enforce."""
    desired = desired_limits(catalog)
    if not desired:
        return []
    if why is None and instance is not None and not instance.event_log_storage.supports_global_concurrency_limits:
        why = "the Dagster instance's storage does not support pools"
    if why is not None:
        return [f"throttle {pool} (max_concurrent {n}) is NOT enforced: {why}" for pool, n in sorted(desired.items())]
    have = current_limits(instance)
    return [f"throttle {pool} (max_concurrent {n}) is NOT enforced: the instance's pool limit is "
            f"{have[pool][0] if pool in have else 'not set'}; run `lakehouse pools sync`"
            for pool, n in sorted(desired.items()) if have.get(pool, (None, True)) != (n, False)]
