"""Table maintenance from metadata: compaction, snapshot expiry, orphan-file removal, manifest rewrite.

Every batch and every publish adds a snapshot and small files; nothing else ever removes them, so
reads get slower and storage grows with every run. For one table this module decides what is due
under the target's `maintenance` block (model.Maintenance; unset fields take the platform settings
`maintenance.<field>`, then DEFAULTS) and runs Iceberg's own Spark procedures for it:

* `rewrite_data_files` (bin-pack) once more than `compact_min_small_files` live data files are under
  `small_file_mb`, writing files of `target_file_size_mb`, and some partition holds two files the
  bin-pack would take (BINPACK_RATIO): it packs within a partition and leaves a partition's lone file
  alone, so a table with one file per partition (a daily rollup's) would cost a Spark job for nothing;
* `expire_snapshots` older than `snapshot_max_age_hours`, keeping the newest `min_snapshots_to_keep`,
  once a snapshot is older than that (or than a branch's own `max-snapshot-age-ms`) or a ref is past
  its `max-ref-age-ms`: nothing else can be expired.
  Iceberg never expires a snapshot a branch or tag points at, so a kept failed audit's branch
  (lakehouse.table.branches) and its data stay readable: a branch's own `max-snapshot-age-ms` only governs
  the branch's older ancestors, never its head. What *can* drop such a branch is a `max-ref-age-ms`
  on the ref or the table property `history.expire.max-ref-age-ms` (unset, branches never expire):
  when one would remove an audit branch, expiry is skipped for the table and the reason recorded.
  An incremental consumer records the upstream snapshot it read up to in its own snapshot summary
  as `lakehouse.consumed.<upstream namespace.table>` = snapshot id (CONSUMED_PREFIX); expiry never
  goes past the oldest such snapshot still in the table, so the next incremental read finds it, nor
  past the table's own newest snapshot carrying such marks (lakehouse.stage.incremental.marks_snapshot:
  after a compaction the head is the compaction's snapshot, which has none), so the table's own
  next incremental run knows what it consumed. A compaction's snapshot (operation `replace`) is
  no change to an incremental consumer: its next run stays incremental;
* `remove_orphan_files` older than `orphan_min_age_hours` (at least 24: a younger file may be a
  concurrent writer's, not yet committed), and not at all while a live run holds a lease on the
  table (lakehouse.runtime.coordination), whose uncommitted files look exactly like orphans. The procedure
  removes only files modified before that cutoff, so when a listing of the table's location (plain
  files, or the platform's S3 client) finds none, it is not called: a table younger than the cutoff
  costs no Spark job, while a table re-created at an old location, holding old files, still does;
* `rewrite_manifests` once the current snapshot has more than MANIFEST_TRIGGER manifests.

A target's quarantine table (`<table>__quarantine`, lakehouse.validation.quarantine) is maintained
with it, right after it, under the same policy, once it exists: it takes the target's publish lock,
leases and kill switch (its rows are published with the target's, under that lock), so
maintained_tables lists it when given a way to tell which tables exist.

What is not due is decided from metadata alone (PyIceberg, the listing): a table with nothing due
costs no Spark call, so a maintenance step whose tables are all quiet starts no SparkSession; every
decision, due or not, is in `reasons`.

Identifiers reach SQL backtick-quoted, values as literals (lakehouse.table.iceberg.quote / sql_string).
Results go to the audit log (event `maintenance`) and back to the caller (the Dagster asset puts them
in its materialization metadata; `lakehouse maintain` prints them).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from lakehouse.metadata.model import Maintenance
from lakehouse.stage.incremental import (  # noqa: F401 - the consumers' key, named here too
    CONSUMED_PREFIX,
    consumed_marks,
    marks_snapshot,
)
from lakehouse.table.iceberg import MAIN, quote, sql_string

if TYPE_CHECKING:
    from lakehouse.metadata.model import MetadataCatalog, Target
    from lakehouse.platform import Platform
    from lakehouse.table.iceberg import IcebergTables

log = logging.getLogger(__name__)

DEFAULTS = Maintenance(enabled=True, snapshot_max_age_hours=168.0, min_snapshots_to_keep=5, target_file_size_mb=128,
                       small_file_mb=32.0, compact_min_small_files=10, orphan_min_age_hours=72.0,
                       rewrite_manifests=True)
DEFAULT_SCHEDULE = "0 3 * * *"  # daily at 03:00 UTC, unless maintenance.schedule[.<namespace>] says otherwise
MANIFEST_TRIGGER = 10
MAX_REF_AGE_PROPERTY = "history.expire.max-ref-age-ms"
AUDIT_EVENT = "maintenance"
MB = 1024 * 1024
# Iceberg's bin-pack (1.10, BinPackRewriteFilePlanner) with the options _run passes: files under
# `min-file-size-bytes` or over `max-file-size-bytes` (unset: BINPACK_RATIO x the target size) are
# candidates, grouped per partition (files of older specs together); a group is rewritten with at least
# `min-input-files` (MIN_INPUT_FILES) of them, or above `max-file-group-size-bytes` (MAX_GROUP_BYTES)
BINPACK_RATIO = 1.8
MIN_INPUT_FILES = 2
MAX_GROUP_BYTES = 100 * 1024 * MB
#: Listed modification times are compared with this much slack (ms) in favour of "old": a file
#: within a second of the cutoff goes to Spark's own listing, which decides
MTIME_SLACK_MS = 1000


# --------------------------------------------------------------------------- what applies


def policy(catalog: MetadataCatalog, target: Target) -> Maintenance:
    """The target's block over the platform settings over DEFAULTS: every field set."""
    out: dict[str, Any] = {}
    for name in Maintenance.model_fields:
        value = getattr(target.maintenance, name) if target.maintenance is not None else None
        if value is None:
            raw = catalog.setting(f"maintenance.{name}")
            value = getattr(Maintenance.model_validate({name: raw}), name) if raw not in (None, "") else None
        out[name] = getattr(DEFAULTS, name) if value is None else value
    return Maintenance(**out)


def schedule(catalog: MetadataCatalog, namespace: str) -> str:
    return (catalog.setting(f"maintenance.schedule.{namespace}") or catalog.setting("maintenance.schedule")
            or DEFAULT_SCHEDULE)


def maintained_tables(catalog: MetadataCatalog, exists: Callable[[str], bool] | None = None) -> list[Target]:
    """The Iceberg targets, then `entity_raw.<app>` of every registered application that no target
    declares (the platform creates those tables; they take the platform defaults, target id
    `entity_raw:<app>`). With `exists`, each table is followed by its quarantine table when that
    exists (quarantine_of: the table's policy)."""
    from lakehouse.metadata.model import Target
    from lakehouse.stage import entity_raw

    out = [t for t in catalog.targets if t.kind == "iceberg"]
    declared = {t.identifier.lower() for t in out}
    for app in entity_raw.registered(catalog):
        ident = entity_raw.table_identifier(app.application_id)
        if ident not in declared:
            ns, tbl = ident.split(".", 1)
            out.append(Target(target_id=f"{ns}:{tbl}", namespace=ns, table=tbl,
                              description=f"raw records of application {app.application_id}"))
    if exists is None:
        return out
    return [x for t in out for x in (t, quarantine_of(t)) if x is t or exists(x.identifier)]


def quarantine_of(target: Target) -> Target:
    """The target's quarantine table as a maintained table: the target's maintenance block (same policy)."""
    from lakehouse.validation.quarantine import quarantine_target

    return quarantine_target(target).model_copy(update={"maintenance": target.maintenance})


def owner(target: Target) -> Target:
    """The table whose writers `target` shares: a quarantine table's data table (its rows are published
    under the data table's publish lock, by runs holding leases on the data table, stopped by its kill
    switch; and its loads claim the data table's pool); any other table itself."""
    from lakehouse.metadata.model import Target
    from lakehouse.validation.quarantine import SUFFIX

    if not (target.table.endswith(SUFFIX) and target.target_id.endswith(SUFFIX)):
        return target
    return Target(target_id=target.target_id.removesuffix(SUFFIX), namespace=target.namespace,
                  table=target.table.removesuffix(SUFFIX))


def namespaces(catalog: MetadataCatalog, exists: Callable[[str], bool] | None = None) -> dict[str, list[Target]]:
    """{namespace: its maintained tables}, in metadata order (with `exists`: quarantine tables too)."""
    out: dict[str, list[Target]] = {}
    for t in maintained_tables(catalog, exists):
        out.setdefault(t.namespace, []).append(t)
    return out


def resolve_target(catalog: MetadataCatalog, name: str) -> Target:
    """A maintained table (or its quarantine table) by target id or by `namespace.table`; KeyError
    naming the known ones otherwise."""
    tables = maintained_tables(catalog)
    t = next((x for x in maintained_tables(catalog, lambda _: True)
              if name in (x.target_id, x.identifier) or x.identifier == name.lower()), None)
    if t is None:
        known = sorted(x.identifier for x in tables)
        raise KeyError(f"unknown table {name!r}: not an Iceberg target or entity_raw table in the metadata; "
                       f"known: {known}")
    return t


# --------------------------------------------------------------------------- what is there


@dataclass
class TableState:
    data_files: int = 0
    small_files: int = 0
    data_bytes: int = 0
    manifests: int = 0
    snapshots: int = 0
    #: partitions where compaction's bin-pack has a group to rewrite (BINPACK_RATIO)
    partitions_to_pack: int = 0
    #: live data files with delete files (merge-on-read): compaction may rewrite those alone
    files_with_deletes: int = 0


def table_state(tables: IcebergTables, ident: str, small_bytes: int, target_bytes: int | None = None) -> TableState:
    """Counts of the current snapshot's live files and the table's snapshots (PyIceberg: no Spark job);
    with `target_bytes` (compaction's output size) also the partitions bin-pack would rewrite."""
    tbl = tables.meta.load_table(ident)
    snap = tbl.current_snapshot()
    st = TableState(snapshots=len(tbl.metadata.snapshots))
    if snap is None:
        return st
    st.manifests = len(snap.manifests(tbl.io))
    spec_id = tbl.metadata.default_spec_id
    big = int(target_bytes * BINPACK_RATIO) if target_bytes else None
    groups: dict[Any, list[int]] = {}
    for task in tbl.scan().plan_files():
        size = task.file.file_size_in_bytes
        st.data_files += 1
        st.data_bytes += size
        st.small_files += size < small_bytes
        st.files_with_deletes += bool(task.delete_files)
        if big is not None and (size < small_bytes or size > big):
            key = (spec_id, repr(task.file.partition)) if task.file.spec_id == spec_id else "older specs"
            groups.setdefault(key, []).append(size)
    st.partitions_to_pack = sum(len(g) >= MIN_INPUT_FILES or sum(g) > MAX_GROUP_BYTES for g in groups.values())
    return st


def location_files(platform: Platform, location: str, older_than_ms: int) -> tuple[str | None, int] | None:
    """(a file under `location` modified before `older_than_ms` or None, files listed until then), by
    plain listing (local) or the platform's S3 client (s3://, s3a://, s3n://); None for a scheme
    neither lists. remove_orphan_files lists exactly that location and removes only such files."""
    url = urlparse(location)
    cutoff = older_than_ms + MTIME_SLACK_MS
    listed = 0
    if url.scheme in ("", "file"):
        stack = [url.path or location]
        while stack:
            try:
                entries = os.scandir(stack.pop())
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for e in entries:
                    if e.is_dir():
                        stack.append(e.path)
                        continue
                    listed += 1
                    if e.stat().st_mtime_ns // 1_000_000 < cutoff:
                        return e.path, listed
        return None, listed
    if url.scheme in ("s3", "s3a", "s3n"):
        prefix = url.path.lstrip("/").rstrip("/") + "/"
        pages = platform.s3.for_source(None).get_paginator("list_objects_v2").paginate(Bucket=url.netloc, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                listed += 1
                if obj["LastModified"].timestamp() * 1000 < cutoff:
                    return f"{url.scheme}://{url.netloc}/{obj['Key']}", listed
        return None, listed
    return None


def consumer_floor(tables: IcebergTables, catalog: MetadataCatalog, ident: str) -> dict[str, int]:
    """{consumer table: the snapshot of `ident` it read up to}, for snapshots `ident` still has."""
    have = {s.snapshot_id for s in tables.meta.load_table(ident).metadata.snapshots}
    out = {}
    for t in maintained_tables(catalog):
        if t.identifier == ident or not tables.exists(t.identifier):
            continue
        # the consumer's last incremental write, also behind a later compaction's snapshot
        mark = consumed_marks(tables.meta.load_table(t.identifier).metadata, tables.snapshot_id(t.identifier)).get(ident)
        if mark is not None and mark in have:
            out[t.identifier] = mark
    return out


def _ref_expiry_threat(tables: IcebergTables, ident: str, now_ms: int) -> str | None:
    """Why expire_snapshots would drop an audit branch (a max-ref-age), or None."""
    from lakehouse.table.branches import PREFIX

    md = tables.meta.load_table(ident).metadata
    table_max = md.properties.get(MAX_REF_AGE_PROPERTY)
    ts = {s.snapshot_id: s.timestamp_ms for s in md.snapshots}
    for name, ref in md.refs.items():
        if name == MAIN or not name.startswith(PREFIX):
            continue
        max_age = ref.max_ref_age_ms or (int(table_max) if table_max else None)
        if max_age is not None and now_ms - ts.get(ref.snapshot_id, now_ms) > max_age:
            return (f"branch {name} is older than its max-ref-age ({max_age} ms): expire_snapshots would drop it; "
                    f"unset {MAX_REF_AGE_PROPERTY} / the ref's max-ref-age to maintain snapshots of {ident}")
    return None


# --------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    table: str
    policy: Maintenance
    before: TableState
    compact: bool
    expire: bool
    orphans: bool
    manifests: bool
    expire_older_than_ms: int
    orphan_older_than_ms: int
    reasons: dict[str, str] = field(default_factory=dict)
    protected: dict[str, int] = field(default_factory=dict)
    #: the listing proved there is no orphan to remove (nothing under the location is old enough)
    no_old_files: bool = False


def _expirable(md, now_ms: int, older_than_ms: int) -> str | None:
    """What expire_snapshots could remove, or None when nothing: it removes only snapshots older than
    `older_than` or than a branch's own `max-snapshot-age-ms`, never a ref's head, and refs past their
    `max-ref-age-ms`."""
    table_max_ref = md.properties.get(MAX_REF_AGE_PROPERTY)
    ts = {s.snapshot_id: s.timestamp_ms for s in md.snapshots}
    cutoff = max([older_than_ms] + [now_ms - r.max_snapshot_age_ms for r in md.refs.values()
                                    if r.snapshot_ref_type == "branch" and r.max_snapshot_age_ms])
    heads = {r.snapshot_id for r in md.refs.values()}  # never expired
    old = sum(s.timestamp_ms < cutoff and s.snapshot_id not in heads for s in md.snapshots)
    if old:
        return f"{old} snapshot(s) older than {_iso(cutoff)}"
    for name, ref in md.refs.items():
        max_age = ref.max_ref_age_ms or (int(table_max_ref) if table_max_ref else None)
        if name != MAIN and max_age is not None and now_ms - ts.get(ref.snapshot_id, now_ms) > max_age:
            return f"ref {name} is past its max-ref-age ({max_age} ms)"
    return None


def plan(platform: Platform, tables: IcebergTables, catalog: MetadataCatalog, target: Target,
         now: float | None = None) -> Plan:
    """What is due for one table now, and why (or why not)."""
    from lakehouse.runtime import coordination

    ident = target.identifier
    pol = policy(catalog, target)
    now_ms = int((time.time() if now is None else now) * 1000)
    before = table_state(tables, ident, int(pol.small_file_mb * MB), pol.target_file_size_mb * MB)
    md = tables.meta.load_table(ident).metadata
    reasons: dict[str, str] = {}
    compact = before.small_files > pol.compact_min_small_files
    reasons["compact"] = (f"{before.small_files} of {before.data_files} live file(s) under {pol.small_file_mb:g} MB "
                          f"({'more than' if compact else 'not more than'} {pol.compact_min_small_files})")
    if compact and not before.partitions_to_pack and not before.files_with_deletes:
        compact = False
        reasons["compact"] += (", but no partition holds two files to bin-pack together: rewrite_data_files "
                               "would rewrite nothing")
    elif compact:
        reasons["compact"] += f"; {before.partitions_to_pack} partition(s) to bin-pack" + (
            f", {before.files_with_deletes} file(s) with deletes" if before.files_with_deletes else "")
    expire_before = now_ms - int(pol.snapshot_max_age_hours * 3600_000)
    protected = consumer_floor(tables, catalog, ident)
    own = marks_snapshot(md, md.refs[MAIN].snapshot_id if MAIN in md.refs else None)
    if own is not None:  # what the table itself consumed last: its next incremental run reads on from there
        protected[ident] = own
    if protected:
        snap_ts = {s.snapshot_id: s.timestamp_ms for s in md.snapshots}
        expire_before = min(expire_before, *(snap_ts[s] for s in protected.values()))
    threat = _ref_expiry_threat(tables, ident, now_ms)
    expire = threat is None and before.snapshots > pol.min_snapshots_to_keep
    reasons["expire"] = threat or (f"{before.snapshots} snapshot(s), keep the newest {pol.min_snapshots_to_keep} and "
                                   f"those after {_iso(expire_before)}"
                                   + (f" (held back for the incremental reads of {sorted(protected)})"
                                      if protected else ""))
    if expire:
        expirable = _expirable(md, now_ms, expire_before)
        expire = expirable is not None
        reasons["expire"] += f": {expirable}" if expire else ": none is older, no ref past its max-ref-age"
    orphan_before = now_ms - int(pol.orphan_min_age_hours * 3600_000)
    live = coordination.live_runs(platform, owner(target).identifier)
    orphans, no_old_files = not live, False
    if live:
        reasons["orphans"] = f"postponed: run(s) {', '.join(sorted(live))} are writing the table"
    else:
        reasons["orphans"] = f"files no snapshot references, older than {pol.orphan_min_age_hours:g} h"
        try:
            listing = location_files(platform, md.location, orphan_before)
        except Exception as exc:  # noqa: BLE001 - Spark's own listing decides, as before
            log.warning("%s: listing %s failed (%s): remove_orphan_files lists it", ident, md.location, exc)
            listing, reasons["orphans"] = None, reasons["orphans"] + f" (listing the location failed: {exc})"
        if listing is None:
            reasons["orphans"] += f" (Spark lists {urlparse(md.location).scheme or 'file'}://)"
        elif listing[0] is None:
            orphans, no_old_files = False, True
            reasons["orphans"] += (f": none can be, no file under the table's location is modified before "
                                   f"{_iso(orphan_before)} ({listing[1]} listed)")
        else:
            reasons["orphans"] += f": the location holds files modified before {_iso(orphan_before)}"
    manifests = bool(pol.rewrite_manifests) and before.manifests > MANIFEST_TRIGGER
    reasons["manifests"] = (f"{before.manifests} manifest(s) "
                            f"({'more than' if manifests else 'not more than'} {MANIFEST_TRIGGER})"
                            if pol.rewrite_manifests else "switched off")
    return Plan(ident, pol, before, compact=compact, expire=expire, orphans=orphans, manifests=manifests,
                expire_older_than_ms=expire_before, orphan_older_than_ms=orphan_before,
                reasons=reasons, protected=protected, no_old_files=no_old_files)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _ts(ms: int) -> str:
    """A Spark TIMESTAMP literal for an instant (explicit UTC, whatever the session time zone)."""
    return f"TIMESTAMP {sql_string(_iso(ms))}"


# --------------------------------------------------------------------------- doing it


def _call(tables: IcebergTables, ident: str, procedure: str, **args: str) -> list[dict]:
    ns, tbl = ident.split(".", 1)
    named = [f"table => {sql_string(f'{quote(ns)}.{quote(tbl)}')}", *(f"{k} => {v}" for k, v in args.items())]
    sql = f"CALL {quote(tables.catalog)}.system.{procedure}({', '.join(named)})"
    log.info("%s", sql)
    return [r.asDict() for r in tables.spark.sql(sql).collect()]


def _options(opts: dict[str, str]) -> str:
    return "map(" + ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in opts.items()) + ")"


def maintain(platform: Platform, target: Target, *, dry_run: bool = False, run_id: str | None = None,
             catalog: MetadataCatalog | None = None, now: float | None = None) -> dict[str, Any]:
    """Run what is due for one table; returns the results (also written to the audit log)."""
    catalog = catalog or platform.catalog()
    tables = platform.tables()
    ident = target.identifier
    started = time.monotonic()
    if not tables.exists(ident):
        return {"table": ident, "skipped": "the table does not exist yet"}
    p = plan(platform, tables, catalog, target, now=now)
    out: dict[str, Any] = {"table": ident, "dry_run": dry_run, "files_before": p.before.data_files,
                           "small_files_before": p.before.small_files, "snapshots_before": p.before.snapshots,
                           "manifests_before": p.before.manifests, "reasons": p.reasons,
                           "due": [k for k in ("compact", "expire", "orphans", "manifests") if getattr(p, k)]}
    if p.protected:
        out["protected_for_consumers"] = p.protected
    off = _switched_off(platform, target, p.policy)
    if off:
        out["skipped"] = off
        platform.store.audit(run_id=run_id, dataset=ident, event=AUDIT_EVENT, outcome="skipped", message=off,
                             details=out)
        return out
    try:
        if dry_run:
            if p.orphans:
                rows = _call(tables, ident, "remove_orphan_files", older_than=_ts(p.orphan_older_than_ms),
                             dry_run="true")
                out["orphan_files_found"] = len(rows)
            elif p.no_old_files:
                out["orphan_files_found"] = 0
        elif out["due"]:
            # a lease like a run's while it writes: its compaction's files, not yet committed, are
            # no dead run's to remove (lakehouse.table.branches.remove_dead_runs_files), and a killed
            # maintenance is a dead run whose files the next run of a stage removes
            import uuid

            from lakehouse.runtime import coordination

            lease = (platform, f"maintenance_{uuid.uuid4().hex[:16]}", owner(target).identifier)
            coordination.hold_lease(*lease)
            try:
                _run(tables, ident, p, out)
            finally:
                coordination.release_lease(*lease)
        else:  # nothing to do: no Spark call (nor a session started for it)
            out.update(files_after=p.before.data_files, small_files_after=p.before.small_files,
                       snapshots_after=p.before.snapshots, manifests_after=p.before.manifests)
    except Exception as exc:
        out["duration_ms"] = int((time.monotonic() - started) * 1000)
        platform.store.audit(run_id=run_id, dataset=ident, event=AUDIT_EVENT, outcome="failed",
                             error_class=type(exc).__name__, message=str(exc).splitlines()[0][:2000] if str(exc) else "",
                             duration_ms=out["duration_ms"], details=out)
        raise
    out["duration_ms"] = int((time.monotonic() - started) * 1000)
    platform.store.audit(run_id=run_id, dataset=ident, event=AUDIT_EVENT, outcome="dry_run" if dry_run else "success",
                         message=", ".join(out["due"]) or "nothing due", duration_ms=out["duration_ms"], details=out)
    return out


def _switched_off(platform: Platform, target: Target, pol: Maintenance) -> str | None:
    """Maintenance commits to the table: the kill switches that stop its writers stop it too."""
    if not pol.enabled:
        return "maintenance.enabled is false"
    if platform.store.flag("platform", "*") is False:
        return "the whole platform is disabled (control_flags platform/*)"
    for t in dict.fromkeys((target.target_id, owner(target).target_id)):
        if platform.store.flag("target", t) is False:
            return f"target {t!r} is disabled by control_flags"
    return None


def _run(tables: IcebergTables, ident: str, p: Plan, out: dict[str, Any]) -> None:
    pol = p.policy
    if p.compact:
        rows = _call(tables, ident, "rewrite_data_files", options=_options({
            "target-file-size-bytes": str(pol.target_file_size_mb * MB),
            "min-file-size-bytes": str(int(pol.small_file_mb * MB)),
            "min-input-files": "2",
        }))
        r = rows[0] if rows else {}
        out["data_files_rewritten"] = int(r.get("rewritten_data_files_count") or 0)
        out["data_files_added"] = int(r.get("added_data_files_count") or 0)
        out["bytes_rewritten"] = int(r.get("rewritten_bytes_count") or 0)
        out["data_files_failed"] = int(r.get("failed_data_files_count") or 0)
    if p.expire:
        n_before = len(tables.meta.load_table(ident).metadata.snapshots)
        rows = _call(tables, ident, "expire_snapshots", older_than=_ts(p.expire_older_than_ms),
                     retain_last=str(int(pol.min_snapshots_to_keep)))
        r = rows[0] if rows else {}
        out["snapshots_expired"] = n_before - len(tables.meta.load_table(ident).metadata.snapshots)
        out["expired_files_deleted"] = int(r.get("deleted_data_files_count") or 0)
        out["expired_manifests_deleted"] = int(r.get("deleted_manifest_files_count") or 0) \
            + int(r.get("deleted_manifest_lists_count") or 0)
    if p.orphans:
        rows = _call(tables, ident, "remove_orphan_files", older_than=_ts(p.orphan_older_than_ms))
        out["orphan_files_removed"] = len(rows)
        if rows:
            log.warning("%s: removed %d orphan file(s) older than %g h", ident, len(rows), pol.orphan_min_age_hours)
    if p.manifests:
        rows = _call(tables, ident, "rewrite_manifests")
        r = rows[0] if rows else {}
        out["manifests_rewritten"] = int(r.get("rewritten_manifests_count") or 0)
        out["manifests_added"] = int(r.get("added_manifests_count") or 0)
    tables.spark.catalog.refreshTable(tables.qualified(ident))
    after = table_state(tables, ident, int(pol.small_file_mb * MB))
    out.update(files_after=after.data_files, small_files_after=after.small_files, snapshots_after=after.snapshots,
               manifests_after=after.manifests)


def maintain_all(platform: Platform, *, namespace: str | None = None, tables: list[str] | None = None,
                 dry_run: bool = False, run_id: str | None = None) -> list[dict[str, Any]]:
    """Every Iceberg target, each followed by its quarantine table once that exists (of `namespace`,
    or the named tables) in metadata order."""
    catalog = platform.catalog()
    if tables:
        targets = [resolve_target(catalog, t) for t in tables]
    else:
        exists = platform.pyiceberg_catalog().table_exists
        targets = [t for ns, ts in namespaces(catalog, exists).items() if namespace in (None, ns) for t in ts]
    return [maintain(platform, t, dry_run=dry_run, run_id=run_id, catalog=catalog) for t in targets]


def metadata_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over tables, flat numbers for Dagster materialization metadata."""
    keys = ("data_files_rewritten", "data_files_added", "snapshots_expired", "orphan_files_removed",
            "manifests_rewritten", "files_before", "files_after", "duration_ms")
    out: dict[str, Any] = {"tables": len(results)}
    for k in keys:
        out[k] = sum(int(r.get(k) or 0) for r in results)
    return out


__all__ = ["DEFAULTS", "Plan", "TableState", "maintain", "maintain_all", "metadata_of", "plan", "policy",
           "schedule"]
