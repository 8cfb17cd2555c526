"""Two writers appending to two branches of one table at once (concurrent Arrow loads, each on its
own audit branch): the loser's commit was built on metadata the winner's commit has moved (every
branch shares the table's sequence-number counter), and PyIceberg's catalog refuses it with a
ValueError, not a CommitFailedException (apache/iceberg#15001). It means the same thing — nothing
was stored, reload and commit again — so it is an ICEBERG_COMMIT_CONFLICT the write retries; before,
such a load failed (tests/test_load_service.py's twenty concurrent loads, when their commits met)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lakehouse import errors
from lakehouse.runtime import retry
from lakehouse.settings import load_settings
from lakehouse.table.catalog import pyiceberg_catalog

SCHEMA = pa.schema([("id", pa.int64()), ("who", pa.string())])


@pytest.fixture
def table_name(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME", "LAKEHOUSE_CONTROL_DB_URL"):
        monkeypatch.delenv(var, raising=False)
    cat = pyiceberg_catalog(load_settings())
    cat.create_namespace("entity_raw")
    table = cat.create_table("entity_raw.app", schema=SCHEMA)
    table.append(pa.table({"id": [0], "who": ["main"]}, schema=SCHEMA))
    head = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_branch(head, "audit_a").create_branch(head, "audit_b").commit()
    return "entity_raw.app"


def _rows(name: str, branch: str) -> list[str]:
    table = pyiceberg_catalog(load_settings()).load_table(name)
    return sorted(r["who"] for r in table.scan(snapshot_id=table.metadata.refs[branch].snapshot_id).to_arrow().to_pylist())


def test_a_commit_beaten_by_another_branchs_commit_is_a_conflict_and_retried(table_name):
    cat = pyiceberg_catalog(load_settings())
    a, b = cat.load_table(table_name), cat.load_table(table_name)  # both writers read the table, then...
    a.append(pa.table({"id": [1], "who": ["a"]}, schema=SCHEMA), branch="audit_a")  # ...a commits first
    with pytest.raises(ValueError, match="sequence number") as lost:
        b.append(pa.table({"id": [2], "who": ["b"]}, schema=SCHEMA), branch="audit_b")
    info = errors.classify(lost.value)
    assert (info.code, info.transient) == (errors.ICEBERG_COMMIT_CONFLICT, True)
    assert retry.retries(retry.BRANCH_WRITE, lost.value)

    # the write as ArrowAuditedWrite makes it: loads the table on every attempt, so the repeat commits
    attempts = []

    def write() -> None:
        table = b if not attempts else cat.load_table(table_name)  # the first attempt's metadata is stale
        attempts.append(1)
        table.append(pa.table({"id": [2], "who": ["b"]}, schema=SCHEMA), branch="audit_b")

    retry.call(retry.BRANCH_WRITE, write, what="race", sleep=lambda _s: None)
    assert len(attempts) == 2
    assert _rows(table_name, "audit_a") == ["a", "main"]
    assert _rows(table_name, "audit_b") == ["b", "main"]  # once: the refused commit stored nothing
    assert _rows(table_name, "main") == ["main"]


def test_other_value_errors_are_not_conflicts():
    info = errors.classify(ValueError("Cannot add snapshot: the schema has no column 'x'"))
    assert info.code != errors.ICEBERG_COMMIT_CONFLICT
    assert not retry.retries(retry.BRANCH_WRITE, ValueError("sequence number 3 is not valid"))
