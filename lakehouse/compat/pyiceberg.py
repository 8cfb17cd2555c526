"""What the exactly-once publish (lakehouse.publish) needs from PyIceberg's transactions beyond its
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
"""

from __future__ import annotations

#: the PyIceberg releases this module was written for and tested with (pyproject pins the same)
WRITTEN_FOR = {"pyiceberg": ">=0.12,<0.13"}


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
