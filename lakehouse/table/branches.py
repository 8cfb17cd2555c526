"""Audit branch and file hygiene: nothing a dead run or a failed audit left behind stays forever.

Every run writes on `audit_<run>` branches of its target (and of the target's quarantine table).
A successful publish removes them in the publishing commit. What can stay:

* the branch of a **failed audit**: kept on purpose for inspection (`lakehouse branches show`),
  recorded in the control DB table `kept_branches`, and dropped once older than the retention
  (platform setting `branches.retention_days`, per target the table property
  `lakehouse.branch_retention_days`; default 7 days);
* the branch of a **dead run** (killed, crashed, its host gone: see `lakehouse.runtime.coordination`
  for how liveness is decided): dropped by the next run of the same stage. A dead run's
  quarantine branch whose data did reach `main` (killed between the two publishes) is published
  instead of dropped, so no quarantined row is lost;
* **files no commit references**: the commits of a dropped branch are expired at once (Iceberg's
  expire-snapshots action deletes exactly the files only they referenced); the data files of a
  commit that never landed (a kill while the commit was being made) are removed by the next run
  of the stage too (`remove_dead_runs_files`): it knows when the dead run took its lease on the
  table, so it hands Iceberg's orphan-file action exactly the files under the table's data folder
  modified since then, while no other run holds a lease on the table (table maintenance takes
  one while it rewrites). Anything else no commit references is left to Iceberg's
  orphan-file removal, only older than a safe minimum age (platform setting
  `orphan_files.min_age_hours`, default 24, as Iceberg's own procedure insists) and only while no
  other live run holds a lease on the table. A run that finds a dead run schedules that sweep for
  when the dead run's files are old enough; the next run of the stage after that moment does it.

`lakehouse branches prune` does all of this on demand (with `--orphans` also the file sweep).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import sqlalchemy as sa

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.metadata.schema import kept_branches, orphan_sweeps
from lakehouse.runtime import coordination
from lakehouse.table.iceberg import MAIN

if TYPE_CHECKING:
    from lakehouse.metadata.model import MetadataCatalog, Target
    from lakehouse.platform import Platform
    from lakehouse.table.iceberg import CatalogTables

log = logging.getLogger(__name__)

PREFIX = "audit_"
RETENTION_SETTING = "branches.retention_days"
RETENTION_PROPERTY = "lakehouse.branch_retention_days"
DEFAULT_RETENTION_DAYS = 7.0
ORPHAN_AGE_SETTING = "orphan_files.min_age_hours"
DEFAULT_ORPHAN_AGE_HOURS = 24.0
DAY_S = 86400.0



def _engine(platform: Platform) -> sa.Engine:
    return coordination.engine_for(platform)


# --------------------------------------------------------------------------- settings


def retention_s(catalog: MetadataCatalog, target: Target | None = None) -> float:
    raw = (target.table_properties.get(RETENTION_PROPERTY) if target is not None else None) \
        or catalog.setting(RETENTION_SETTING)
    return (float(raw) if raw not in (None, "") else DEFAULT_RETENTION_DAYS) * DAY_S


def orphan_min_age_s(catalog: MetadataCatalog) -> float:
    raw = catalog.setting(ORPHAN_AGE_SETTING)
    return (float(raw) if raw not in (None, "") else DEFAULT_ORPHAN_AGE_HOURS) * 3600.0


# --------------------------------------------------------------------------- kept branches


def keep_failed_audit(platform: Platform, idents: list[str], branch: str, run_id: str, reason: str) -> None:
    """A failed audit's branches stay for inspection until the retention has passed."""
    eng = _engine(platform)
    now = time.time()
    with eng.begin() as conn:
        for ident in idents:
            conn.execute(sa.delete(kept_branches).where(kept_branches.c.table_ident == ident,
                                                        kept_branches.c.branch == branch))
            conn.execute(sa.insert(kept_branches).values(table_ident=ident, branch=branch, run_id=run_id[:128],
                                                         kept_at=now, reason=reason[:4000]))


def kept(platform: Platform, ident: str) -> dict[str, dict]:
    eng = _engine(platform)
    with eng.connect() as conn:
        return {r["branch"]: dict(r) for r in conn.execute(
            sa.select(kept_branches).where(kept_branches.c.table_ident == ident)).mappings()}


def _forget(platform: Platform, ident: str, branch: str) -> None:
    with _engine(platform).begin() as conn:
        conn.execute(sa.delete(kept_branches).where(kept_branches.c.table_ident == ident,
                                                    kept_branches.c.branch == branch))


# --------------------------------------------------------------------------- states


@dataclass
class BranchState:
    table: str
    branch: str
    snapshot_id: int
    state: str  # running | failed_audit | expired | dead | own | other
    run_id: str | None = None
    kept_until: str = ""
    added_records: str = ""


def branch_states(platform: Platform, tables: CatalogTables, ident: str, *, lease_table: str | None = None,
                  retention: float, own: str | None = None, now: float | None = None) -> list[BranchState]:
    """Every branch of `ident` but main, with what should happen to it."""
    if not tables.exists(ident):
        return []
    now = time.time() if now is None else now
    lease_table = lease_table or ident
    eng = coordination.engine_for(platform)
    leases = coordination.leases(platform, lease_table)
    keep = kept(platform, ident)
    out = []
    for name, snap in tables.refs(ident).items():
        if name == MAIN:
            continue
        summary = tables.snapshot_summary(ident, snap)
        st = BranchState(ident, name, snap, "other", summary.get("lakehouse.run_id"),
                         added_records=summary.get("added-records", ""))
        if not name.startswith(PREFIX):
            out.append(st)  # somebody's own branch: never touched
            continue
        if name == own:
            st.state = "own"
        elif name in keep:
            until = keep[name]["kept_at"] + retention
            st.kept_until = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(until)) + " UTC"
            st.run_id = st.run_id or keep[name]["run_id"]
            st.state = "failed_audit" if now < until else "expired"
        elif name in leases and leases[name].alive(eng, now):
            st.state = "running"
        else:
            st.state = "dead"
        out.append(st)
    return out


# --------------------------------------------------------------------------- dropping


def drop_branch_and_commits(tables: CatalogTables, ident: str, branch: str) -> int:
    """Drop `branch` and expire the snapshots only it referenced; Iceberg deletes the files only
    those snapshots referenced (data files published elsewhere stay). Returns snapshots expired."""
    from lakehouse.table.iceberg import _walk_parents, retry_metadata_commit

    md = tables.meta.load_table(ident).metadata
    parents = {s.snapshot_id: s.parent_snapshot_id for s in md.snapshots}
    refs = {n: r.snapshot_id for n, r in md.refs.items()}
    if branch not in refs:
        return 0
    others = set()
    for name, snap in refs.items():
        if name != branch:
            others.update(_walk_parents(parents, snap))
    exclusive = [s for s in _walk_parents(parents, refs[branch]) if s not in others]
    retry_metadata_commit(tables, ident, lambda: tables.drop_branch(ident, branch))
    if exclusive:
        try:
            retry_metadata_commit(tables, ident, lambda: tables.expire_snapshots(ident, exclusive))
        except Exception as exc:  # noqa: BLE001 - the ref is gone; the files wait for the orphan sweep
            log.warning("%s: dropped %s but could not expire its %d commit(s): %s", ident, branch, len(exclusive),
                        str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            return 0
    return len(exclusive)


def _publish_dead_quarantine(platform: Platform, tables: CatalogTables, q_ident: str, data_ident: str,
                             st: BranchState) -> bool:
    """A dead run's quarantine branch whose data reached main: finish its publish. True if published."""
    from lakehouse.table.publish import chain, publish_branch

    if not st.run_id or not tables.exists(data_ident):
        return False
    data_md = tables.meta.load_table(data_ident).metadata
    main = data_md.refs[MAIN].snapshot_id if MAIN in data_md.refs else None
    landed = any((s.summary.additional_properties if s.summary else {}).get("lakehouse.run_id") == st.run_id
                 for s in chain(data_md, main))
    if not landed:
        return False
    res = publish_branch(tables, q_ident, st.branch, since=None, run_id=None)
    if res.published:
        log.warning("%s: published quarantine branch %s of dead run %s (its data was already on main)",
                    q_ident, st.branch, st.run_id)
        return True
    return False


def tidy_table(platform: Platform, tables: CatalogTables, ident: str, *, retention: float,
               lease_table: str | None = None, data_ident: str | None = None, own: str | None = None,
               reason: str = "") -> list[BranchState]:
    """Drop the dead runs' and expired failed audits' branches of `ident`. With `data_ident`,
    `ident` is that table's quarantine table: a dead run's branch is published when its data landed."""
    dropped = []
    for st in branch_states(platform, tables, ident, lease_table=lease_table, retention=retention, own=own):
        if st.state not in ("dead", "expired"):
            continue
        if st.state == "dead" and data_ident is not None and _publish_dead_quarantine(
                platform, tables, ident, data_ident, st):
            st.state = "published"
            dropped.append(st)
            continue
        expired = drop_branch_and_commits(tables, ident, st.branch)
        if st.state == "expired":
            _forget(platform, ident, st.branch)
        log.warning("%s: dropped branch %s of %s run %s (%d commit(s) expired)%s", ident, st.branch,
                    "a dead" if st.state == "dead" else "an expired failed-audit", st.run_id or "?", expired,
                    f" — {reason}" if reason else "")
        dropped.append(st)
    return dropped


# --------------------------------------------------------------------------- orphan files


def schedule_orphan_sweep(platform: Platform, ident: str, lease_table: str, due_at: float, reason: str) -> None:
    eng = _engine(platform)
    with eng.begin() as conn:
        row = conn.execute(sa.select(orphan_sweeps.c.due_at).where(orphan_sweeps.c.table_ident == ident)).first()
        if row is not None and row[0] <= due_at:
            return
        conn.execute(sa.delete(orphan_sweeps).where(orphan_sweeps.c.table_ident == ident))
        conn.execute(sa.insert(orphan_sweeps).values(table_ident=ident, lease_table=lease_table, due_at=due_at,
                                                     reason=reason[:2000]))


def due_sweeps(platform: Platform, ident: str | None = None, now: float | None = None) -> list[dict]:
    eng = _engine(platform)
    q = sa.select(orphan_sweeps).where(orphan_sweeps.c.due_at <= (time.time() if now is None else now))
    if ident is not None:
        q = q.where(orphan_sweeps.c.table_ident == ident)
    with eng.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings()]


def remove_orphan_files(platform: Platform, tables: CatalogTables, ident: str, *, min_age_s: float,
                        lease_table: str | None = None, own_run: str | None = None) -> list[str] | None:
    """Iceberg's orphan-file removal for files older than `min_age_s`; None (nothing done) while
    another live run holds a lease on the table, since its uncommitted files look like orphans."""
    lease_table = lease_table or ident
    others = coordination.live_runs(platform, lease_table) - ({own_run} if own_run else set())
    if others:
        log.info("%s: orphan-file sweep postponed, run(s) %s are writing it", ident, ", ".join(sorted(others)))
        return None
    if not tables.exists(ident):
        return []
    from lakehouse.table.iceberg import IcebergTables

    # Iceberg's orphan-file action runs on Spark: the Arrow engine's tables hand it to Spark's
    spark_tables = tables if isinstance(tables, IcebergTables) else platform.tables()
    spark = spark_tables.spark
    older_than = int((time.time() - min_age_s) * 1000)
    result = pyspark_compat.jvm(spark).org.apache.iceberg.spark.actions.SparkActions.get(
        pyspark_compat.java_session(spark)) \
        .deleteOrphanFiles(spark_tables.java_table(ident)).olderThan(older_than).execute()
    removed = [str(p) for p in result.orphanFileLocations()]
    if removed:
        log.warning("%s: removed %d orphan file(s) older than %.1fh", ident, len(removed), min_age_s / 3600)
    return removed


#: a file's modification time, as the store keeps it, may lag or lead this host's clock a little
DEAD_FILES_SLACK_S = 2.0


def data_files_between(platform: Platform, data_location: str, since: float, until: float) -> list[tuple[str, float]]:
    """(path, modified at) of every file under `data_location` (a table's data folder) modified in
    [since, until), by plain listing (local) or the platform's S3 client; paths spelt from
    `data_location` as Iceberg spells the files it writes there. [] for a scheme neither lists."""
    url = urlparse(data_location)
    base = data_location.rstrip("/")
    out: list[tuple[str, float]] = []
    if url.scheme in ("", "file"):
        root = (url.path or data_location).rstrip("/")
        stack = [root]
        while stack:
            try:
                entries = os.scandir(stack.pop())
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for e in entries:
                    if e.name.startswith((".", "_")):  # hidden, as Iceberg's own listing (Hadoop's .crc files)
                        continue
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        mtime = e.stat(follow_symlinks=False).st_mtime
                        if since <= mtime < until:
                            out.append((f"{base}/{os.path.relpath(e.path, root)}", mtime))
    elif url.scheme in ("s3", "s3a", "s3n"):
        prefix = url.path.lstrip("/").rstrip("/") + "/"
        pages = platform.s3.for_source(None).get_paginator("list_objects_v2").paginate(Bucket=url.netloc, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                mtime = obj["LastModified"].timestamp()
                if since <= mtime < until and not obj["Key"].rsplit("/", 1)[-1].startswith((".", "_")):
                    out.append((f"{base}/{obj['Key'][len(prefix):]}", mtime))
    return out


def remove_dead_runs_files(platform: Platform, tables: CatalogTables, ident: str, *, since: float,
                           lease_table: str | None = None, own_run: str | None = None) -> list[str] | None:
    """The data files of commits that never landed, written by runs now dead: the files under the
    table's data folder modified since the earliest dead run took its lease on the table (`since`)
    that no snapshot of the table references (any branch, tag or older snapshot still listed:
    Iceberg's own orphan-file action decides that, on exactly these candidates), removed at once
    rather than by the sweep a day later. Only while no other live run holds a lease on the table
    (its uncommitted files look the same), and only files modified before that was checked (a run
    that takes its lease after the check writes later). None: postponed (the sweep stays due)."""
    lease_table = lease_table or ident
    checked_at = time.time()
    others = coordination.live_runs(platform, lease_table) - ({own_run} if own_run else set())
    if others:
        log.warning("%s: removing the files of dead runs' commits postponed (to the orphan-file sweep): run(s) "
                    "%s are writing it", ident, ", ".join(sorted(others)))
        return None
    if not tables.exists(ident):
        return []
    md = tables.meta.load_table(ident).metadata
    data_location = md.properties.get("write.data.path") or f"{md.location.rstrip('/')}/data"
    candidates = data_files_between(platform, data_location, since - DEAD_FILES_SLACK_S,
                                    checked_at - DEAD_FILES_SLACK_S)
    log.info("%s: %d file(s) under %s modified since the dead run(s) started: orphans among them are removed",
             ident, len(candidates), data_location)
    if not candidates:
        return []
    from lakehouse.table.iceberg import IcebergTables

    spark_tables = tables if isinstance(tables, IcebergTables) else platform.tables()
    spark = spark_tables.spark
    view = f"lakehouse_dead_run_files_{uuid.uuid4().hex}"
    spark.createDataFrame([(p, datetime.fromtimestamp(t, tz=UTC)) for p, t in candidates],
                          "file_path string, last_modified timestamp").createOrReplaceTempView(view)
    try:
        result = pyspark_compat.jvm(spark).org.apache.iceberg.spark.actions.SparkActions.get(
            pyspark_compat.java_session(spark)) \
            .deleteOrphanFiles(spark_tables.java_table(ident)) \
            .compareToFileList(pyspark_compat.java_session(spark).table(view)) \
            .olderThan(int(checked_at * 1000)).execute()
    finally:
        spark.catalog.dropTempView(view)
    removed = [str(p) for p in result.orphanFileLocations()]
    for path in removed:  # the local file system's checksum beside it (hidden: not listed above)
        local = urlparse(path)
        if local.scheme in ("", "file"):
            folder, name = os.path.split(local.path)
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, f".{name}.crc"))
    if removed:
        log.warning("%s: removed %d data file(s) of dead runs' commits that never landed", ident, len(removed))
    return removed


def run_due_sweeps(platform: Platform, tables: CatalogTables, catalog: MetadataCatalog, ident: str,
                   own_run: str | None = None) -> dict[str, int]:
    out = {}
    for sweep in due_sweeps(platform, ident):
        removed = remove_orphan_files(platform, tables, sweep["table_ident"], min_age_s=orphan_min_age_s(catalog),
                                      lease_table=sweep["lease_table"], own_run=own_run)
        if removed is None:
            continue
        with _engine(platform).begin() as conn:
            conn.execute(sa.delete(orphan_sweeps).where(orphan_sweeps.c.table_ident == sweep["table_ident"]))
        out[sweep["table_ident"]] = len(removed)
    return out


# --------------------------------------------------------------------------- a stage's tidy-up


def tidy_before_write(platform: Platform, tables: CatalogTables, catalog: MetadataCatalog, ident: str,
                      run_id: str, related: tuple[str, ...] = (), target: Target | None = None) -> dict:
    """Before a run writes `ident`: drop what dead runs and expired audits left on it and on its
    `related` tables (the quarantine table), schedule / run the orphan-file sweep. Under the
    table's publish lock, so that a quarantine roll-forward cannot race a live publish."""
    own = coordination.run_key(run_id)
    retention = retention_s(catalog, target)
    held = coordination.leases(platform, ident)
    dead_leases = coordination.forget_dead_leases(platform, ident)
    dead_since = min((held[k].started_at for k in dead_leases if k in held), default=None)
    dropped: list[BranchState] = []
    with coordination.publish_lock(platform, ident):
        dropped += tidy_table(platform, tables, ident, retention=retention, own=own)
        for rel in related:
            dropped += tidy_table(platform, tables, rel, retention=retention, lease_table=ident, data_ident=ident,
                                  own=own)
    if dropped or dead_leases:
        due = time.time() + orphan_min_age_s(catalog)
        why = f"dead run(s) {', '.join(sorted({d.branch for d in dropped} | set(dead_leases)))}"
        for t in (ident, *related):
            schedule_orphan_sweep(platform, t, ident, due, why)
        platform.store.audit(run_id=run_id, dataset=ident, event="branches_tidied", outcome="success",
                             message=f"{len(dropped)} branch(es) of dead runs / expired audits handled",
                             details={"branches": [asdict(d) for d in dropped], "dead_leases": dead_leases})
    dead_files = 0
    if dead_since is not None:  # the files of the dead runs' commits that never landed: now, not in a day
        for t in (ident, *related):
            removed = remove_dead_runs_files(platform, tables, t, since=dead_since, lease_table=ident, own_run=own)
            dead_files += len(removed or ())
    swept = {}
    for t in (ident, *related):
        swept.update(run_due_sweeps(platform, tables, catalog, t, own_run=own))
    return {"branches_dropped": len([d for d in dropped if d.state != "published"]),
            "quarantine_branches_completed": len([d for d in dropped if d.state == "published"]),
            **({"dead_run_files_removed": dead_files} if dead_files else {}),
            **({"orphan_files_removed": sum(swept.values())} if swept else {})}


def prune(platform: Platform, tables: CatalogTables, catalog: MetadataCatalog, idents: list[str] | None = None,
          orphans: bool = False, orphan_min_age_hours: float | None = None) -> list[dict]:
    """`lakehouse branches prune`: for every Iceberg target (or the given tables) and its
    quarantine table, drop dead runs' and expired failed audits' branches; with `orphans`, also
    remove orphan files older than the minimum age."""
    from lakehouse.validation.quarantine import quarantine_identifier

    targets = [t for t in catalog.targets if t.kind == "iceberg"]
    by_ident = {t.identifier: t for t in targets}
    wanted = idents or list(by_ident)
    report = []
    min_age = orphan_min_age_s(catalog) if orphan_min_age_hours is None else orphan_min_age_hours * 3600.0
    for ident in wanted:
        target = by_ident.get(ident)
        retention = retention_s(catalog, target)
        data_ident = ident[: -len("__quarantine")] if ident.endswith("__quarantine") else None
        lease_table = data_ident or ident
        related = [quarantine_identifier(ident)] if data_ident is None and idents is None else []
        coordination.forget_dead_leases(platform, lease_table)
        for t, d in ((ident, data_ident), *((r, ident) for r in related)):
            if not tables.exists(t):
                continue
            with coordination.publish_lock(platform, d or t):
                dropped = tidy_table(platform, tables, t, retention=retention, lease_table=d or t, data_ident=d)
            row = {"table": t, "dropped": [x.branch for x in dropped if x.state != "published"],
                   "published": [x.branch for x in dropped if x.state == "published"]}
            if orphans:
                removed = remove_orphan_files(platform, tables, t, min_age_s=min_age, lease_table=d or t)
                row["orphan_files_removed"] = "postponed (a run is writing)" if removed is None else len(removed)
                if removed is not None:
                    with _engine(platform).begin() as conn:
                        conn.execute(sa.delete(orphan_sweeps).where(orphan_sweeps.c.table_ident == t))
            report.append(row)
    if report:
        platform.store.audit(event="branches_pruned", outcome="success",
                             details={"tables": json.loads(json.dumps(report, default=str))})
    return report
