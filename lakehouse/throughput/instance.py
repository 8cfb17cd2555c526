"""The Dagster instance headless runs use, so throttles hold in the CLI as in the UI and daemon.

Pools are honoured only by a persistent instance. `lakehouse run` and `metadata apply` therefore
use `$DAGSTER_HOME`, or — when it is not set — `$LAKEHOUSE_HOME/dagster_home`, created from
`deploy/dagster.dev.yaml` exactly as `scripts/up.sh` does for `dagster dev`: the CLI, the UI and
the daemon share one instance and one set of pool limits. `--ephemeral` (or
`LAKEHOUSE_DAGSTER_EPHEMERAL=1`) opts out, and then every max_concurrent throttle is reported as
not enforced. Creating the home is serialised by a file lock: two first runs at once must not both
initialise the instance's databases or its pool slots.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.settings import Settings

if TYPE_CHECKING:
    import dagster as dg

EPHEMERAL_ENV = "LAKEHOUSE_DAGSTER_EPHEMERAL"
TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "dagster.dev.yaml"
#: tags of a headless run, so a later run can tell that its process is gone (slots to reclaim)
PID_TAG, HOST_TAG = "lakehouse/pid", "lakehouse/host"


def dagster_home(settings: Settings) -> Path:
    home = os.environ.get("DAGSTER_HOME")
    return Path(home) if home else settings.home / "dagster_home"


def ensure_home(settings: Settings) -> Path:
    """DAGSTER_HOME for this process: the configured one, or the default under LAKEHOUSE_HOME
    (created with the template's dagster.yaml if missing). Sets DAGSTER_HOME in this process."""
    from lakehouse.throughput.dagster_storage import file_lock

    home = dagster_home(settings)
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(str(home / ".init.lock")):
        cfg = home / "dagster.yaml"
        if not cfg.exists() and not os.environ.get("DAGSTER_HOME"):
            if not TEMPLATE.is_file():
                raise FileNotFoundError(f"no instance template at {TEMPLATE}: set DAGSTER_HOME to a Dagster instance")
            shutil.copyfile(TEMPLATE, cfg)
        os.environ["DAGSTER_HOME"] = str(home)
        import dagster as dg

        dg.DagsterInstance.get().dispose()  # first use creates the storage: inside the lock
    return home


@dataclass
class HeadlessInstance:
    instance: dg.DagsterInstance
    persistent: bool
    home: Path | None
    notes: list[str] = field(default_factory=list)  # throttles that cannot be enforced, and why


def unenforced(catalog: MetadataCatalog, instance: dg.DagsterInstance | None, why: str | None = None) -> list[str]:
    """A line per max_concurrent throttle that the instance will not enforce."""
    from lakehouse.throughput.pools import current_limits, desired_limits

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


def headless_instance(settings: Settings, catalog: MetadataCatalog, *, ephemeral: bool = False) -> HeadlessInstance:
    """The instance for a headless run, its pools synced from the throttles metadata."""
    import dagster as dg

    from lakehouse.throughput.pools import sync_instance

    if ephemeral or os.environ.get(EPHEMERAL_ENV, "") not in ("", "0"):
        inst = dg.DagsterInstance.ephemeral()
        return HeadlessInstance(inst, False, None, unenforced(catalog, inst, "the run uses an ephemeral Dagster "
                                                              "instance (--ephemeral), which ignores pools"))
    home = ensure_home(settings)
    inst = dg.DagsterInstance.get()
    if inst.event_log_storage.supports_global_concurrency_limits:
        sync_instance(inst, catalog)  # metadata is the truth, even if changed by plain SQL since
        free_stale_slots(inst)
    return HeadlessInstance(inst, True, home, unenforced(catalog, inst))


def free_stale_slots(instance: dg.DagsterInstance) -> list[str]:
    """Free the pool slots of runs that are over, or whose headless process on this host is gone
    (kill -9): without a daemon's run monitoring such slots would block the pool for good."""
    import socket

    from lakehouse.coordination import pid_alive
    from lakehouse.throughput.pools import MANAGED_PREFIXES

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
