"""What the exactly-once publish (lakehouse.table.publish) needs from PyIceberg's transactions beyond its
documented API: public calls only, but each relies on a behaviour PyIceberg does not promise, so
each is written for the versions in `WRITTEN_FOR` and checked by tests/test_compat_pyiceberg.py
(which fails on a PyIceberg outside them).

* `no_retry`: a commit that is ONE compare-and-swap. PyIceberg retries a transaction holding a
  snapshot producer (an append) on CommitFailedException, re-applying it on the newer `main`
  without the caller's exactly-once check. There is no per-commit switch; the count is the table
  property `commit.retry.num-retries`, read from the metadata the transaction starts from.
* `hold_ref`: a requirement on a ref. PyIceberg adds `AssertRefSnapshotId(ref, where it is)` only
  with a change of that ref, and keeps one requirement per kind across the stagings of a
  transaction (a second AssertRefSnapshotId staged later is dropped), so every ref the commit
  depends on is held in the one ManageSnapshots batch staged first.
* `memo_transaction`: the one override of PyIceberg internals. `Transaction.table_metadata`
  re-applies the staged updates to the table's metadata and deep-copies the result on every read;
  one append reads it ~15 times, and each read grows with the table's snapshots (an Arrow append
  took 105 -> 335 ms at 80 snapshots with PyIceberg's own transaction). The memo keeps the result
  while the table's metadata object and the staged-updates tuple are the same objects: PyIceberg
  replaces both (never mutates them) on every stage, commit and refresh, and its metadata models
  are frozen, so a kept result is what a fresh computation returns (bar `last-updated-ms`, which
  the catalog sets again on commit). Upstream: apache/iceberg-python#3302 and #3784 (the same cache,
  not merged).
"""

from __future__ import annotations

from pyiceberg.table import Transaction
from pyiceberg.table.update import update_table_metadata

#: the PyIceberg releases this module was written for and tested with (pyproject pins the same)
WRITTEN_FOR = {"pyiceberg": ">=0.12,<0.13"}


class MemoTransaction(Transaction):
    """A `Transaction` whose `table_metadata` is computed once per state (module docstring)."""

    _memo = None

    @property
    def table_metadata(self):
        base, updates = self._table.metadata, self._updates
        memo = self._memo
        if memo is not None and memo[0] is base and memo[1] is updates:
            return memo[2]
        result = update_table_metadata(base, updates)  # what Transaction.table_metadata returns
        self._memo = (base, updates, result)  # holds base and updates: their ids stay theirs
        return result


def memo_transaction(table, autocommit: bool = False) -> MemoTransaction:
    """A transaction on `table` (as `table.transaction()`), its metadata computed once per state."""
    return MemoTransaction(table, autocommit=autocommit)


def no_retry(table):
    """`table` whose transactions commit once: a conflict raises CommitFailedException (and PyIceberg
    deletes the manifests written for it) instead of being re-applied on the newer metadata.

    Only this in-memory copy's metadata says `commit.retry.num-retries=0`: the catalog applies a
    commit's updates to the metadata it holds, so the property is never written."""
    from pyiceberg.table import Table, TableProperties

    md = table.metadata
    once = md.model_copy(update={"properties": {**md.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}})
    return Table(table.name(), once, table.metadata_location, table.io, table.catalog)


def hold_ref(ms, metadata, ref: str, snapshot_id: int | None = None):
    """Stage `ref` := `snapshot_id` (default: where it is: no change) on ManageSnapshots `ms`, its
    retention kept; the commit then requires `ref` to be where `metadata` has it."""
    r = metadata.refs[ref]
    return ms.create_branch(r.snapshot_id if snapshot_id is None else snapshot_id, ref, r.max_ref_age_ms,
                            r.max_snapshot_age_ms, r.min_snapshots_to_keep)
