"""lakehouse/compat/pyiceberg.py: written for the PyIceberg releases it names, and the behaviours the
exactly-once publish (lakehouse.table.publish) builds on them hold — a publish commit is ONE compare-and-swap
on `main` and on the branch, refused (never re-applied) when either moved, leaving nothing behind.
Real PyIceberg on a SQLite SQL catalog, no Spark."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
import pytest
from packaging.specifiers import SpecifierSet
from pyiceberg.exceptions import CommitFailedException

from lakehouse.compat import pyiceberg as pyiceberg_compat
from lakehouse.settings import load_settings
from lakehouse.table import publish
from lakehouse.table.catalog import pyiceberg_catalog
from lakehouse.table.iceberg import MAIN

SCHEMA = pa.schema([("id", pa.int64())])
NAME = "compat.t"
BRANCH = "audit_run1"


def test_the_installed_pyiceberg_is_one_the_shim_was_written_for():
    for dist, spec in pyiceberg_compat.WRITTEN_FOR.items():
        installed = version(dist)
        assert installed in SpecifierSet(spec), (
            f"{dist} {installed} is installed; lakehouse/compat/pyiceberg.py was written for {dist}{spec}: "
            "check its behaviours again (this module's tests), then widen WRITTEN_FOR and the pin")


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME", "LAKEHOUSE_CONTROL_DB_URL"):
        monkeypatch.delenv(var, raising=False)
    cat = pyiceberg_catalog(load_settings())
    cat.create_namespace("compat")
    table = cat.create_table(NAME, schema=SCHEMA)
    table.append(pa.table({"id": [0]}, schema=SCHEMA))
    table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, BRANCH).commit()
    cat.load_table(NAME).append(pa.table({"id": [1]}, schema=SCHEMA), branch=BRANCH)
    return cat


def _ids(cat, ref: str = MAIN) -> list[int]:
    table = cat.load_table(NAME)
    return sorted(r["id"] for r in table.scan(snapshot_id=table.metadata.refs[ref].snapshot_id).to_arrow().to_pylist())


def _state(table):
    md = table.metadata
    return md.refs[MAIN].snapshot_id, md.refs[BRANCH].snapshot_id


def _branch_own(table):
    """The branch's own snapshots (not on main) and the data files they added."""
    main, head = _state(table)
    snap = table.metadata.snapshot_by_id(head)
    ours = [snap]
    files = [e.data_file for m in snap.manifests(table.io) for e in m.fetch_manifest_entry(table.io)
             if e.snapshot_id == head]
    return ours, files


def _metadata_files(table) -> set[str]:
    return {p.name for p in Path(table.location().removeprefix("file://"), "metadata").iterdir()}


def test_a_fast_forward_moves_main_and_drops_the_branch_in_one_commit(catalog):
    table = catalog.load_table(NAME)
    main, head = _state(table)
    publish._fast_forward(table, BRANCH, main, head)
    after = catalog.load_table(NAME).metadata
    assert after.refs[MAIN].snapshot_id == head and BRANCH not in after.refs
    assert _ids(catalog) == [0, 1]


@pytest.mark.parametrize("moved", [MAIN, BRANCH])
def test_a_fast_forward_is_refused_when_main_or_the_branch_moved(catalog, moved):
    stale = catalog.load_table(NAME)
    main, head = _state(stale)
    catalog.load_table(NAME).append(pa.table({"id": [2]}, schema=SCHEMA), branch=moved)
    before = catalog.load_table(NAME).metadata.refs
    with pytest.raises(CommitFailedException):
        publish._fast_forward(stale, BRANCH, main, head)
    assert catalog.load_table(NAME).metadata.refs == before  # nothing changed


def test_a_rebase_appends_the_branch_files_on_main_and_drops_the_branch_and_its_snapshots(catalog):
    table = catalog.load_table(NAME)
    catalog.load_table(NAME).append(pa.table({"id": [2]}, schema=SCHEMA))  # main moved since the branch
    table = catalog.load_table(NAME)
    main, head = _state(table)
    ours, files = _branch_own(table)
    publish._rebase(table, BRANCH, main, head, ours, files, "tok")
    md = catalog.load_table(NAME).metadata
    new = md.snapshot_by_id(md.refs[MAIN].snapshot_id)
    assert new.parent_snapshot_id == main and new.summary.operation.value == "append"
    assert new.summary.additional_properties[publish.TOKEN_PROPERTY] == "tok"
    assert BRANCH not in md.refs and md.snapshot_by_id(head) is None
    assert _ids(catalog) == [0, 1, 2]


@pytest.mark.parametrize("moved", [MAIN, BRANCH])
def test_a_rebase_is_refused_when_main_or_the_branch_moved_and_leaves_no_file(catalog, moved):
    stale = catalog.load_table(NAME)
    main, head = _state(stale)
    ours, files = _branch_own(stale)
    catalog.load_table(NAME).append(pa.table({"id": [2]}, schema=SCHEMA), branch=moved)
    fresh = catalog.load_table(NAME)
    before_refs, before_files = fresh.metadata.refs, _metadata_files(fresh)
    with pytest.raises(CommitFailedException):  # not re-applied on the newer main without publish's check
        publish._rebase(stale, BRANCH, main, head, ours, files, "tok")
    assert catalog.load_table(NAME).metadata.refs == before_refs
    assert _metadata_files(fresh) == before_files  # PyIceberg deleted the manifests written for it


def test_why_no_retry_pyiceberg_re_applies_an_append_on_a_newer_main(catalog):
    """The behaviour `no_retry` exists for: the same append without it lands on whatever main became."""
    stale = catalog.load_table(NAME)
    catalog.load_table(NAME).append(pa.table({"id": [2]}, schema=SCHEMA))
    with stale.transaction() as txn:
        txn.append(pa.table({"id": [3]}, schema=SCHEMA))
    assert _ids(catalog) == [0, 2, 3]

    stale = catalog.load_table(NAME)
    catalog.load_table(NAME).append(pa.table({"id": [4]}, schema=SCHEMA))
    with pytest.raises(CommitFailedException):
        with pyiceberg_compat.no_retry(stale).transaction() as txn:
            txn.append(pa.table({"id": [5]}, schema=SCHEMA))
    assert _ids(catalog) == [0, 2, 3, 4]
    assert "commit.retry.num-retries" not in catalog.load_table(NAME).metadata.properties  # never written


def test_a_memo_transaction_computes_the_metadata_once_per_state_and_as_pyiceberg_does(catalog, monkeypatch):
    """PyIceberg's Transaction.table_metadata re-applies and deep-copies on every read; the memo keeps
    it while the table's metadata and the staged updates are the same objects, and gives what
    PyIceberg's own (uncached) computation gives. Fails if PyIceberg starts mutating either in place."""
    from pyiceberg.table import Transaction

    calls: list[int] = []
    real = pyiceberg_compat.update_table_metadata
    monkeypatch.setattr(pyiceberg_compat, "update_table_metadata",
                        lambda base, ups: calls.append(len(ups)) or real(base, ups))
    table = catalog.load_table(NAME)
    tx = pyiceberg_compat.memo_transaction(table)
    first = tx.table_metadata
    assert tx.table_metadata is first and calls == [0]
    tx.set_properties(owner="compat")  # a staged update is a new state: computed again, with it
    staged = tx.table_metadata
    assert staged is not first and staged.properties["owner"] == "compat" and calls == [0, 1]
    theirs = Transaction.table_metadata.fget(tx)  # PyIceberg's own, uncached
    assert staged.model_dump(exclude={"last_updated_ms"}) == theirs.model_dump(exclude={"last_updated_ms"})
    with tx:
        tx.append(pa.table({"id": [7]}, schema=SCHEMA))
    after = catalog.load_table(NAME)
    assert after.properties["owner"] == "compat" and _ids(catalog) == [0, 7]
    assert len(calls) < 10, calls  # an append reads it ~15 times; computed once per state
