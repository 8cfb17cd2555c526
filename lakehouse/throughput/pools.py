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
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lakehouse.metadata.model import MetadataCatalog

if TYPE_CHECKING:
    import dagster as dg

    from lakehouse.runner import Platform

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


def instance_from_env() -> dg.DagsterInstance | None:
    """The persistent instance under $DAGSTER_HOME (default $LAKEHOUSE_HOME/dagster_home, the one
    headless runs use: lakehouse.throughput.instance), or None when there is none to sync."""
    from lakehouse.settings import load_settings
    from lakehouse.throughput.instance import dagster_home

    home = dagster_home(load_settings())
    if not home.is_dir():
        return None
    os.environ["DAGSTER_HOME"] = str(home)
    import dagster as dg

    return dg.DagsterInstance.get()


def sync_pools(platform: Platform, instance: dg.DagsterInstance | None = None) -> PoolSync | None:
    """Called by `lakehouse metadata apply`: sync the instance headless runs, the UI and the daemon
    share (created under LAKEHOUSE_HOME if needed), and say which throttles it cannot enforce."""
    from lakehouse.throughput.instance import EPHEMERAL_ENV, dagster_home, ensure_home, unenforced

    catalog = platform.store.load()
    if instance is None and not desired_limits(catalog) and not dagster_home(platform.settings).is_dir():
        return None  # no throttles and no instance: nothing to sync, nothing to create
    if instance is None and os.environ.get(EPHEMERAL_ENV, "") not in ("", "0"):
        for line in unenforced(catalog, None, f"{EPHEMERAL_ENV} is set: headless runs use an ephemeral instance"):
            print(f"warning: {line}", file=sys.stderr)
        return None
    try:
        if instance is None:
            ensure_home(platform.settings)
            import dagster as dg

            instance = dg.DagsterInstance.get()
        result = sync_instance(instance, catalog)
    except Exception as exc:  # the metadata is applied; the sensor retries the sync on its next tick
        print(f"warning: dagster pools not synced ({type(exc).__name__}: {exc}); "
              "the lakehouse_throughput_sync sensor will retry", file=sys.stderr)
        return None
    print(f"dagster pools ({os.environ.get('DAGSTER_HOME')}): {result.summary()}")
    for line in unenforced(catalog, instance):
        print(f"warning: {line}", file=sys.stderr)
    return result
