"""The upstream snapshots a run pinned: what every later read of those tables in the run sees.

A stage that reads lake tables (SQL, Python, an iceberg source) pins each of them when its extract plans
(`plan.upstream_snapshots`); the load reads exactly those snapshots, even if another run moved
`main` in between. The pins are also recorded per run here, so that the Dagster IO manager,
which loads a downstream stage's upstream tables as asset inputs, reads the same snapshots
(`pinned`), and so that every stage of a run reading one table reads one version of it (the
first pin of a table in a run wins).

They are kept as one small JSON file per run in the platform's staging area, next to the staged
input the load step of the same run already reads from there (a run's steps share a host: one
process per run, docs/ARCHITECTURE.md). Written by rename, so a reader never sees half a file;
a new run removes the pins of runs older than a week.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse.platform import Platform
    from lakehouse.stage.core import ExtractPlan, StageContext

#: `pinned` of a table the run has not pinned
NOT_PINNED = object()
#: pins of runs older than this are removed (a run, its retries and re-executions are long over)
KEEP_S = 7 * 86_400


def _path(platform: Platform, run_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)
    return platform.settings.staging_dir / "pins" / f"{safe}.json"


def _read(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def record(platform: Platform, run_id: str, snapshots: dict[str, int | None],
           read_from: dict[str, str] | None = None) -> dict[str, int | None]:
    """Pin `snapshots` (identifier -> snapshot id, None: no table yet) for the run; a table the run
    pinned before keeps its first pin. `read_from`: a replica read instead of the table (recovery).
    Returns the run's pins of these tables (the earlier ones where there were)."""
    path = _path(platform, run_id)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.exists():  # a new run: the pins of runs long over go (a listing per run, no more)
        _prune(path.parent)
    pins = _read(path)
    for ident, snap in snapshots.items():
        pins.setdefault(ident.lower(), {"snapshot_id": snap, "table": (read_from or {}).get(ident, ident)})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(pins, f)
    os.replace(tmp, path)
    return {ident: pins[ident.lower()]["snapshot_id"] for ident in snapshots}


def _prune(folder: Path) -> None:
    cutoff = time.time() - KEEP_S
    for p in folder.glob("*.json"):
        try:
            if p.stat().st_mtime < cutoff:
                p.unlink()
        except FileNotFoundError:  # another run pruned it first
            pass


def pinned(platform: Platform, run_id: str, identifier: str) -> dict | object:
    """{"snapshot_id", "table"} the run pinned for `identifier`, or NOT_PINNED."""
    return _read(_path(platform, run_id)).get(identifier.lower(), NOT_PINNED)


def read_pinned(platform: Platform, identifier: str, snapshot_id: int | None, table: str | None = None,
                spark: Any = None) -> DataFrame:
    """`identifier` (or its replica `table`) as a Spark DataFrame at `snapshot_id` (None: as it is
    now), with `spark` (the process-wide session, as the Dagster resource hands it) or the platform's."""
    reader = (spark or platform.spark()).read.format("iceberg")
    if snapshot_id is not None:
        reader = reader.option("snapshot-id", str(snapshot_id))
    return reader.load(f"{platform.settings.catalog_name}.{table or identifier}")


def pin_upstream(ctx: StageContext, plan: ExtractPlan, identifiers: list[str]) -> None:
    """Pin every upstream table at its current snapshot (a replica's, when recovery swapped it);
    a table this run pinned before keeps that pin, so one run reads one version of it."""
    from lakehouse.table.iceberg import MAIN

    tables = ctx.platform.tables()
    refs = {i: tables.refs_if_exists(ctx.table_overrides.get(i, i)) for i in identifiers}
    missing = [i for i, r in refs.items() if r is None]
    if missing:  # e.g. its stage only ever quarantined files or skipped: nothing to read, not a failure
        plan.skipped_reason = (f"upstream {', '.join(sorted(missing))} does not exist yet: nothing has been "
                               "published to it (its stage skipped, quarantined all its input or has not run); "
                               "this stage runs once it has")
        ctx.audit("upstream_missing", outcome="skipped", message=plan.skipped_reason, details={"missing": missing})
        return
    current = {ident: r.get(MAIN) for ident, r in refs.items()}
    plan.upstream_snapshots = record(ctx.platform, ctx.run_id, current, ctx.table_overrides)


def upstream_frames(ctx: StageContext, plan: ExtractPlan) -> dict[str, DataFrame]:
    """identifier -> DataFrame of each pinned upstream: the asset input's loader (the IO manager's,
    `ctx.upstream_frames`, same pin), else read here at the pinned snapshot."""
    overrides = plan.details.get("table_overrides", {})  # an unavailable upstream read from its replica
    out = {}
    for ident, snap in plan.upstream_snapshots.items():
        load = ctx.upstream_frames.get(ident.lower())
        out[ident] = load() if load is not None else read_pinned(ctx.platform, ident, snap, overrides.get(ident))
    return out
