"""The Dagster instance headless runs use, so throttles hold in the CLI as in the UI and daemon.

Pools are honoured only by a persistent instance. `lakehouse run` and `metadata apply` therefore
use `$DAGSTER_HOME`, or — when it is not set — `$LAKEHOUSE_HOME/dagster_home`, created from
`deploy/dagster.dev.yaml` as `scripts/up.sh` does for `dagster dev` (its `{env: DAGSTER_HOME}` written
out as the home's path, so the instance opens with `DagsterInstance.from_config` and nothing here
writes the environment): the CLI, the UI and the daemon share one instance and one set of pool limits. `--ephemeral` (or
`LAKEHOUSE_DAGSTER_EPHEMERAL=1`) opts out, and then every max_concurrent throttle is reported as
not enforced. Creating the home is serialised by a file lock: two first runs at once must not both
initialise the instance's databases or its pool slots.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.orchestration.pools import (  # noqa: F401 - unenforced: what callers have imported from here
    MANAGED_PREFIXES,
    PoolSync,
    desired_limits,
    sync_instance,
    unenforced,
)
from lakehouse.settings import Settings, load_settings

if TYPE_CHECKING:
    import dagster as dg

    from lakehouse.platform import Platform

EPHEMERAL_ENV = "LAKEHOUSE_DAGSTER_EPHEMERAL"
TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "dagster.dev.yaml"
HOME_REF = "{env: DAGSTER_HOME}"  # what the template's storage base_dir says
#: modules an older template named (Dagster internals the platform no longer replaces): a home made
#: from it is made again from the current template
RETIRED = ("lakehouse.throughput.dagster_storage", "lakehouse.throughput.compute_logs")
#: tags of a headless run, so a later run can tell that its process is gone (slots to reclaim)
PID_TAG, HOST_TAG = "lakehouse/pid", "lakehouse/host"


def dagster_home(settings: Settings) -> Path:
    home = settings.dagster_home  # DAGSTER_HOME
    return Path(home) if home else settings.home / "dagster_home"


def _write_config(home: Path) -> None:
    """The default home's dagster.yaml: the template, its storage under this home by path. An older
    copy that names `{env: DAGSTER_HOME}` is rewritten the same way (inside the caller's lock)."""
    cfg = home / "dagster.yaml"
    text = cfg.read_text() if cfg.exists() else None
    if text is not None and any(m in text for m in RETIRED):
        cfg.with_name("dagster.yaml.bak").write_text(text)  # the operator's copy, for their own edits
        text = None
    if text is not None:
        if HOME_REF not in text:
            return
    else:
        if not TEMPLATE.is_file():
            raise FileNotFoundError(f"no instance template at {TEMPLATE}: set DAGSTER_HOME to a Dagster instance")
        text = TEMPLATE.read_text()
    cfg.write_text(text.replace(HOME_REF, json.dumps(str(home))))  # a JSON string is a YAML string


def open_instance(home: Path) -> dg.DagsterInstance:
    """The persistent instance of `home` (its dagster.yaml), without reading or writing DAGSTER_HOME."""
    import dagster as dg

    return dg.DagsterInstance.from_config(str(home))


def ensure_home(settings: Settings) -> Path:
    """The Dagster home for this process: $DAGSTER_HOME, or the default under LAKEHOUSE_HOME
    (created with the template's dagster.yaml if missing)."""
    home, instance = ensure_instance(settings)
    instance.dispose()
    return home


def ensure_instance(settings: Settings) -> tuple[Path, dg.DagsterInstance]:
    """`ensure_home`, and the instance it opened to create the storage: a run keeps it (opening
    the instance again costs what the first open did, minus creating the databases)."""
    from lakehouse.compat.dagster import file_lock

    home = dagster_home(settings)
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(str(home / ".init.lock")):
        if not settings.dagster_home:  # the default home, the platform's own: its dagster.yaml kept current
            _write_config(home)
        instance = open_instance(home)  # first use creates the storage: inside the lock
    return home, instance


@dataclass
class HeadlessInstance:
    instance: dg.DagsterInstance
    persistent: bool
    home: Path | None
    notes: list[str] = field(default_factory=list)  # throttles that cannot be enforced, and why


def headless_instance(settings: Settings, catalog: MetadataCatalog, *, ephemeral: bool = False) -> HeadlessInstance:
    """The instance for a headless run, its pools synced from the throttles metadata."""
    import dagster as dg

    if ephemeral or settings.dagster_ephemeral:
        inst = dg.DagsterInstance.ephemeral()
        return HeadlessInstance(inst, False, None, unenforced(catalog, inst, "the run uses an ephemeral Dagster "
                                                              "instance (--ephemeral), which ignores pools"))
    home, inst = ensure_instance(settings)
    if inst.event_log_storage.supports_global_concurrency_limits:
        sync_instance(inst, catalog)  # metadata is the truth, even if changed by plain SQL since
        free_stale_slots(inst)
    return HeadlessInstance(inst, True, home, unenforced(catalog, inst))


def free_stale_slots(instance: dg.DagsterInstance) -> list[str]:
    """Free the pool slots of runs that are over, or whose headless process on this host is gone
    (kill -9): without a daemon's run monitoring such slots would block the pool for good."""
    import socket

    from lakehouse.runtime.coordination import pid_alive
    storage = instance.event_log_storage
    freed: list[str] = []
    for pool in sorted(k for k in storage.get_concurrency_keys() if k.startswith(MANAGED_PREFIXES)):
        for run_id in sorted({s.run_id for s in storage.get_concurrency_info(pool).claimed_slots}):
            run = instance.get_run_by_id(run_id)
            dead = run is None or run.is_finished
            if not dead and run.tags.get(HOST_TAG) == socket.gethostname() and run.tags.get(PID_TAG):
                dead = not pid_alive(int(run.tags[PID_TAG]))
                if dead:
                    instance.report_run_failed(run, f"lakehouse: the process of headless run {run_id} (pid "
                                                    f"{run.tags[PID_TAG]}) is gone; its pool slots were freed")
            if dead:
                storage.free_concurrency_slots_for_run(run_id)
                freed.append(run_id)
    return freed


def run_tags() -> dict[str, str]:
    import socket

    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname()}


def instance_from_env() -> dg.DagsterInstance | None:
    """The persistent instance under $DAGSTER_HOME (default $LAKEHOUSE_HOME/dagster_home, the one
    headless runs use: lakehouse.orchestration.instance), or None when there is none to sync."""
    settings = load_settings()
    if not dagster_home(settings).is_dir():
        return None
    return ensure_instance(settings)[1]


def sync_pools(platform: Platform, instance: dg.DagsterInstance | None = None) -> PoolSync | None:
    """Called by `lakehouse metadata apply`: sync the instance headless runs, the UI and the daemon
    share (created under LAKEHOUSE_HOME if needed), and say which throttles it cannot enforce."""
    catalog = platform.store.load()
    if instance is None and not desired_limits(catalog) and not dagster_home(platform.settings).is_dir():
        return None  # no throttles and no instance: nothing to sync, nothing to create
    if instance is None and platform.settings.dagster_ephemeral:
        for line in unenforced(catalog, None, f"{EPHEMERAL_ENV} is set: headless runs use an ephemeral instance"):
            print(f"warning: {line}", file=sys.stderr)
        return None
    try:
        if instance is None:
            _home, instance = ensure_instance(platform.settings)
        result = sync_instance(instance, catalog)
        where = instance.root_directory
    except Exception as exc:  # the metadata is applied; the sensor retries the sync on its next tick
        print(f"warning: dagster pools not synced ({type(exc).__name__}: {exc}); "
              "the lakehouse_throughput_sync sensor will retry", file=sys.stderr)
        return None
    print(f"dagster pools ({where}): {result.summary()}")
    for line in unenforced(catalog, instance):
        print(f"warning: {line}", file=sys.stderr)
    return result
