"""Exactly-once publish of an audit branch to `main`: the decisive check, bound to one commit.

Whatever planned a run's work (a sensor, a pool, claims, the extract step), two runs can still
hold the same input on their branches. At publish time a run therefore compares what its branch
adds with what `main` committed since the run planned — landing/S3 files (key + etag) and
entity_raw keys from the `lakehouse.files` snapshot property, JDBC watermarks from
`lakehouse.jdbc.watermark` — and publishes only when nothing overlaps. Otherwise it reports the
overlap (`Overlap`, "N files already loaded by run R") and the caller re-writes the remainder on
a fresh branch, or publishes nothing.

The check and the commit are bound to the same `main` snapshot S: the commit is made with
PyIceberg as ONE compare-and-swap with the requirement `AssertRefSnapshotId(main, S)` and no
automatic retry (Iceberg's own commit retry would re-apply a cherry-pick or an append on a newer
`main` without our check). The SQL catalog (SQLite or PostgreSQL) turns it into
`UPDATE iceberg_tables SET metadata_location = new WHERE metadata_location = <the one S came
from>`: if anybody committed in between, nothing changes, and the loop checks again. The commit:

* fast-forward when `main` is an ancestor of the branch head: `main := head`;
* rebase when `main` moved and every branch commit only appended: one new snapshot on S listing
  the branch's data files (no data is rewritten), carrying the branch's checkpoint properties;
* otherwise (`Stale`: a MERGE or overwrite computed against an older `main`) nothing: the caller
  writes again on a branch of the current `main`.

Each commit also removes the branch ref (and, after a rebase, the branch's own snapshots), and
carries `lakehouse.publish_token`, so a commit whose acknowledgement was lost (an outage in the
middle of it) is recognised on the next attempt instead of being made twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from lakehouse.compat import pyiceberg as pyiceberg_compat
from lakehouse.table.iceberg import MAIN, _publish_lock, _walk_parents

if TYPE_CHECKING:
    from lakehouse.table.iceberg import IcebergTables

log = logging.getLogger(__name__)

FILES_PROPERTY = "lakehouse.files"
RUN_ID_PROPERTY = "lakehouse.run_id"
WATERMARK_PROPERTY = "lakehouse.jdbc.watermark"
JDBC_SOURCE_PROPERTY = "lakehouse.jdbc.source"
TOKEN_PROPERTY = "lakehouse.publish_token"
#: properties whose values are lists of file checkpoints: a rebase concatenates them
_LIST_PROPERTIES = (FILES_PROPERTY,)
#: Iceberg's own summary keys: recomputed by the new snapshot, never copied
_ICEBERG_SUMMARY_PREFIXES = ("added-", "deleted-", "removed-", "changed-", "total-", "replace-partitions",
                             "partition-summaries-included", "spark.app.id", "engine-", "iceberg-version",
                             "wap.id", "operation", "partitions.")


@dataclass(frozen=True)
class Commit:
    """What one snapshot says it loaded."""

    snapshot_id: int
    run_id: str | None
    files: frozenset[tuple[str, str]]
    jdbc_source: str | None = None
    watermark: str | None = None  # encoded as in lakehouse.ingest.jdbc


@dataclass
class Overlap:
    """Input of this branch that `main` already holds, by the run that put it there."""

    files: dict[str, set[tuple[str, str]]] = field(default_factory=dict)  # run_id -> (key, etag)
    watermark: str | None = None  # main's JDBC watermark, at or past this branch's low end
    watermark_run: str | None = None
    covers_all: bool = False  # nothing of this branch is left to publish

    def __bool__(self) -> bool:
        return bool(self.files) or self.watermark is not None

    @property
    def file_count(self) -> int:
        return sum(len(v) for v in self.files.values())

    def message(self) -> str:
        parts = [f"{len(keys)} file(s) already loaded by run {run}" for run, keys in sorted(self.files.items())]
        if self.watermark is not None:
            parts.append(f"source rows up to watermark {self.watermark} already loaded by run {self.watermark_run}")
        return "; ".join(parts)

    def details(self) -> dict[str, Any]:
        return {"files_already_loaded": self.file_count,
                "already_loaded_by": {r: len(k) for r, k in self.files.items()},
                **({"watermark_already_loaded": self.watermark, "watermark_run": self.watermark_run}
                   if self.watermark is not None else {})}


@dataclass
class PublishResult:
    snapshot_id: int | None = None
    published: bool = False
    how: str = ""  # fast_forward | rebase | already | nothing
    overlap: Overlap | None = None
    stale: bool = False  # main moved and the branch cannot be rebased: write again


# --------------------------------------------------------------------------- reading summaries


def commit_of(snapshot) -> Commit:
    props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
    files: set[tuple[str, str]] = set()
    raw = props.get(FILES_PROPERTY)
    if raw:
        files = {(f["key"], f["etag"]) for f in json.loads(raw)}
    return Commit(snapshot.snapshot_id, props.get(RUN_ID_PROPERTY), frozenset(files),
                  props.get(JDBC_SOURCE_PROPERTY), props.get(WATERMARK_PROPERTY))


def chain(metadata, head: int | None, stop: int | None = None) -> list:
    """Snapshots from `head` back to (not including) `stop`; the whole history when `stop` is None
    or not an ancestor of `head` (main rolled back: then everything on main counts)."""
    if head is None:
        return []
    ids = _walk_parents({s.snapshot_id: s.parent_snapshot_id for s in metadata.snapshots}, head)
    if stop is not None and stop in ids:
        ids = ids[:ids.index(stop)]
    return [metadata.snapshot_by_id(i) for i in ids]


def branch_commits(metadata, head: int, fork: int | None) -> list[Commit]:
    """The branch's own commits (after `fork`, the main snapshot it was created on), oldest first."""
    return [commit_of(s) for s in reversed(chain(metadata, head, fork))]


def find_overlap(metadata, *, main: int | None, since: int | None, ours: list[Commit],
                 run_id: str | None = None, watermark_order=None) -> Overlap:
    """What `main` committed after `since` (the main snapshot the run planned on) that this
    branch's commits also hold. `watermark_order` maps an encoded watermark to something comparable."""
    mine_files = set().union(*(c.files for c in ours)) if ours else set()
    sources = {c.jdbc_source for c in ours if c.jdbc_source}
    overlap = Overlap()
    theirs = [commit_of(s) for s in chain(metadata, main, since)]
    for c in theirs:
        if run_id is not None and c.run_id == run_id:
            continue  # our own earlier publish (a partial rewrite loop)
        hit = mine_files & c.files
        if hit:
            overlap.files.setdefault(c.run_id or f"snapshot {c.snapshot_id}", set()).update(hit)
    if sources and watermark_order is not None:
        newest = next((c for c in theirs if c.watermark and c.jdbc_source in sources
                       and (run_id is None or c.run_id != run_id)), None)
        ours_high = max((c.watermark for c in ours if c.watermark), key=watermark_order, default=None)
        if newest is not None and ours_high is not None:
            overlap.watermark, overlap.watermark_run = newest.watermark, newest.run_id
            overlap.covers_all = watermark_order(newest.watermark) >= watermark_order(ours_high)
    if mine_files and overlap.files and mine_files <= set().union(*overlap.files.values()):
        overlap.covers_all = True
    return overlap


# --------------------------------------------------------------------------- committing


def _props_of(ours: list, token: str) -> dict[str, str]:
    """Snapshot properties for one commit standing for all of the branch's commits."""
    out: dict[str, str] = {}
    lists: dict[str, list] = {}
    for snap in ours:
        props = snap.summary.additional_properties if snap.summary is not None else {}
        for k, v in props.items():
            if k.startswith(_ICEBERG_SUMMARY_PREFIXES):
                continue
            if k in _LIST_PROPERTIES:
                lists.setdefault(k, []).extend(json.loads(v))
            else:
                out[k] = v  # the newest commit wins (e.g. the highest watermark)
    out.update({k: json.dumps(v, separators=(",", ":")) for k, v in lists.items()})
    out[TOKEN_PROPERTY] = token
    return out


def _appends_only(snaps: Iterable) -> bool:
    return all(s.summary is not None and s.summary.operation.value == "append" for s in snaps)


def _fast_forward(table, branch: str, main: int | None, head: int) -> None:
    """main := head and drop the branch, requiring main = `main` and branch = `head`: one commit
    (snapshot-ref changes only: PyIceberg never retries those)."""
    from pyiceberg.table.update.snapshot import ManageSnapshots

    ms = ManageSnapshots(pyiceberg_compat.memo_transaction(table, autocommit=True))
    ms = ms.create_branch(head, MAIN) if main is None else pyiceberg_compat.hold_ref(ms, table.metadata, MAIN, head)
    ms.remove_branch(branch).commit()


def _rebase(table, branch: str, main: int, head: int, ours: list, data_files: list, token: str) -> None:
    """Append the branch's data files to `main` as one new snapshot (metadata only), drop the branch
    and its own snapshots; requiring main = `main` and branch = `head`: one commit."""
    from pyiceberg.table.update.snapshot import ExpireSnapshots, ManageSnapshots

    txn = pyiceberg_compat.memo_transaction(pyiceberg_compat.no_retry(table))
    pyiceberg_compat.hold_ref(ManageSnapshots(txn), table.metadata, MAIN).remove_branch(branch).commit()
    with txn.update_snapshot(snapshot_properties=_props_of(ours, token)).fast_append() as append:
        for f in data_files:
            append.append_data_file(f)
    held = {r.snapshot_id for r in txn.table_metadata.refs.values()}  # a tag on one of them keeps it
    ExpireSnapshots(txn).by_ids([s.snapshot_id for s in ours if s.snapshot_id not in held]).commit()
    txn.commit_transaction()


def publish_branch(tables: IcebergTables, identifier: str, branch: str, *, since: int | None = None,
                   run_id: str | None = None, check: bool = True, watermark_order=None,
                   can_rebase: bool = True) -> PublishResult:
    """Publish `branch` of `identifier` to main exactly once (see the module docstring).

    `since`: the main snapshot the run planned on (None: check main's whole history).
    `can_rebase`: the branch's appends may be re-applied on a newer main (false for MERGE, whose
    inserts were decided against the main it forked from). Callers
    hold `coordination.publish_lock` of the table so that concurrent publishers queue instead
    of failing their compare-and-swap; correctness does not depend on the lock.
    """
    from lakehouse.runtime import retry

    token: str | None = None

    def attempt() -> PublishResult:
        nonlocal token
        table = _load(tables, identifier, "loading it to publish")
        md = table.metadata
        parents = {s.snapshot_id: s.parent_snapshot_id for s in md.snapshots}
        main = md.refs[MAIN].snapshot_id if MAIN in md.refs else None
        head = md.refs[branch].snapshot_id if branch in md.refs else None
        if head is None:
            done = _already_published(md, main, token)
            if done is not None:
                return PublishResult(done, True, "already")
            raise ValueError(f"{identifier} has no branch {branch!r} to publish")
        on_main = set(_walk_parents(parents, main)) if main is not None else set()
        own = [md.snapshot_by_id(i) for i in reversed(_walk_parents(parents, head)) if i not in on_main]
        if check:
            overlap = find_overlap(md, main=main, since=since, ours=[commit_of(s) for s in own],
                                   run_id=run_id, watermark_order=watermark_order)
            if overlap:
                return PublishResult(main, False, "nothing", overlap=overlap)
        token = f"{branch}:{head}"
        if main is None or main in _walk_parents(parents, head):
            _ride(tables, identifier, partial(_fast_forward, table, branch, main, head))
            return PublishResult(head, True, "fast_forward")
        found = tables.data_files(identifier, head, own[0].parent_snapshot_id) if own and can_rebase and _appends_only(own) else None
        if found is None:
            return PublishResult(main, False, "nothing", stale=True)
        _ride(tables, identifier, partial(_rebase, table, branch, main, head, own, found[1], token))
        return PublishResult(_already_published(_load(tables, identifier, "reading it").metadata, None, token),
                             True, "rebase")

    # main moved during the compare-and-swap: each attempt reads main again and checks again
    return retry.call(retry.PUBLISH, attempt, what=f"publishing {identifier}@{branch}")


def _ride(tables: IcebergTables, identifier: str, work):
    from lakehouse.runtime.outage import ride_out

    return ride_out(work, database=tables.catalog_label, what=f"publishing {identifier}", role="Iceberg catalog")


def _load(tables: IcebergTables, identifier: str, why: str):
    from lakehouse.runtime.outage import ride_out

    return ride_out(lambda: tables.meta.load_table(identifier), database=tables.catalog_label,
                    what=f"{why}: {identifier}", role="Iceberg catalog")


def _already_published(md, main: int | None, token: str | None) -> int | None:
    """The main snapshot our commit made, if a previous attempt landed (its answer was lost)."""
    if token is None:
        return None
    head_id = int(token.rsplit(":", 1)[1])
    main = main if main is not None else (md.refs[MAIN].snapshot_id if MAIN in md.refs else None)
    for s in chain(md, main):
        props = s.summary.additional_properties if s.summary is not None else {}
        if s.snapshot_id == head_id or props.get(TOKEN_PROPERTY) == token:
            return main
    return None


def publish(tables: IcebergTables, identifier: str, branch: str) -> int | None:
    """Make `branch` visible on main (and drop it) without losing concurrent commits to main:
    one compare-and-swap commit under the table's publish lock, fast-forward or a metadata-only
    rebase of appends, without the exactly-once checks (a plain DataFrame written by the IO
    manager). Raises ValueError when a merge/overwrite branch is stale."""
    with _publish_lock(tables.catalog, identifier):
        res = publish_branch(tables, identifier, branch, check=False)
    if res.stale:
        raise ValueError(f"{identifier}: main moved since branch {branch!r} was created and the branch "
                         "rewrote data (merge/overwrite): write it again on a branch of the current main")
    return res.snapshot_id


class Superseded(Exception):
    """Raised inside a stage run when its publish found its input already on main (or main moved
    under a MERGE/overwrite): the runner writes the remainder again on a fresh branch."""

    def __init__(self, result: PublishResult):
        super().__init__(result.overlap.message() if result.overlap else "main moved under a non-append write")
        self.result = result


def remainder_plan(plan, result: PublishResult, split: Callable[[Any, PublishResult], Any]):
    """The part of `plan` nobody else published (None: nothing is left), after `result`; `split`
    is the source adapter's `remainder` (which files, which watermark window). The remainder
    counts as planned on the main snapshot the check saw: later commits get checked."""
    import dataclasses

    plan = dataclasses.replace(plan, main_at_plan=result.snapshot_id)
    overlap = result.overlap
    if overlap is None:  # stale: the same input, written again on top of the current main
        return plan
    if overlap.covers_all:
        return None
    return split(plan, result)
