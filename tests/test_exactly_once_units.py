"""The parts of exactly-once that need no Spark: the publish check and its compare-and-swap commit
(PyIceberg on a real SQLite catalog), claims and leases in a real control DB, the publish lock,
and riding out a database that refuses connections (a real closed port).

The end-to-end proofs with Spark, concurrent `lakehouse run` processes, kill -9 and a stopped
PostgreSQL server are in test_concurrent_runs.py, test_outage.py and test_branch_hygiene.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException

from lakehouse.errors import DATABASE_UNAVAILABLE, DatabaseUnavailable, classify
from lakehouse.metadata.store import MetadataStore
from lakehouse.runtime import coordination, outage
from lakehouse.stage.runner import Platform
from lakehouse.table.iceberg import IcebergTables
from lakehouse.table.publish import _fast_forward, publish_branch
from tests.fixtures.net import free_port

SCHEMA = pa.schema([pa.field("id", pa.int64())])


@pytest.fixture
def lake(tmp_path):
    cat = SqlCatalog("units", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    cat.create_namespace("ns")
    table = cat.create_table("ns.t", schema=SCHEMA)
    table.append(pa.table({"id": [0]}, schema=SCHEMA))
    return cat, IcebergTables(None, "units", cat)


def branch_with(cat, name: str, run: str, files: list[str], ids: list[int]) -> int:
    """A run's audit branch off the current main: one commit carrying its file checkpoints."""
    table = cat.load_table("ns.t")
    table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, name).commit()
    table = cat.load_table("ns.t")
    props = {"lakehouse.files": json.dumps([{"key": f, "etag": "e1", "size": 1} for f in files]),
             "lakehouse.run_id": run}
    table.append(pa.table({"id": ids}, schema=SCHEMA), snapshot_properties=props, branch=name)
    return cat.load_table("ns.t").metadata.refs[name].snapshot_id


def ids(cat) -> list[int]:
    return sorted(cat.load_table("ns.t").scan().to_arrow().column("id").to_pylist())


def test_publish_fast_forwards_rebases_and_refuses_input_main_already_has(lake):
    cat, tables = lake
    start = cat.load_table("ns.t").current_snapshot().snapshot_id
    branch_with(cat, "audit_a", "a", ["f1", "f2"], [1, 2])
    branch_with(cat, "audit_b", "b", ["f1", "f3"], [1, 3])  # f1 also planned by run a
    branch_with(cat, "audit_c", "c", ["f4"], [4])

    first = publish_branch(tables, "ns.t", "audit_a", since=start, run_id="a")
    assert first.published and first.how == "fast_forward"
    second = publish_branch(tables, "ns.t", "audit_b", since=start, run_id="b")
    assert not second.published and second.overlap.files == {"a": {("f1", "e1")}}
    assert not second.overlap.covers_all and "1 file(s) already loaded by run a" in second.overlap.message()
    third = publish_branch(tables, "ns.t", "audit_c", since=start, run_id="c")
    assert third.published and third.how == "rebase"  # main moved: c's data files appended, no rewrite
    assert ids(cat) == [0, 1, 2, 4]
    md = cat.load_table("ns.t").metadata
    assert set(md.refs) == {"main", "audit_b"}  # each publish removed its branch in the same commit
    head = md.snapshot_by_id(md.refs["main"].snapshot_id).summary.additional_properties
    assert json.loads(head["lakehouse.files"]) == [{"key": "f4", "etag": "e1", "size": 1}]
    assert head["lakehouse.run_id"] == "c" and head["lakehouse.publish_token"].startswith("audit_c:")


def test_the_commit_is_bound_to_the_main_snapshot_it_checked(lake):
    """The decisive check cannot be overtaken: a commit prepared against main S fails once main
    moved, instead of being re-applied on the newer main (Iceberg's own retry would)."""
    cat, tables = lake
    start = cat.load_table("ns.t").current_snapshot().snapshot_id
    head_a = branch_with(cat, "audit_a", "a", ["f1"], [1])
    branch_with(cat, "audit_b", "b", ["f1"], [1])
    checked = cat.load_table("ns.t")  # run a checked main here: no overlap yet
    assert publish_branch(tables, "ns.t", "audit_b", since=start, run_id="b").published  # b wins the race
    with pytest.raises(CommitFailedException):
        _fast_forward(checked, "audit_a", start, head_a)
    assert ids(cat) == [0, 1]
    res = publish_branch(tables, "ns.t", "audit_a", since=start, run_id="a")  # checks again: all taken
    assert not res.published and res.overlap.covers_all and ids(cat) == [0, 1]


def test_claims_split_work_and_dead_runs_lose_theirs(settings):
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    items = [("a.jsonl", "e1"), ("b.jsonl", "e1"), ("c.jsonl", "e2")]
    coordination.hold_lease(platform, "run-a", "ns.t")
    first = coordination.claim(platform, "ns.t", "run-a", items[:2])
    assert first.mine == items[:2] and not first.taken
    second = coordination.claim(platform, "ns.t", "run-b", items)
    assert second.mine == [items[2]] and second.taken == {"audit_run_a": items[:2]}
    assert "2 item(s) being loaded by run audit_run_a" in second.message()
    # run a dies: its lease names a process of this host that no longer exists
    coordination._HEARTBEAT.remove(platform.store.engine, "audit_run_a", "ns.t")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with platform.store.engine.begin() as conn:
        conn.execute(sa.update(coordination.run_leases).values(pid=gone.pid))
    third = coordination.claim(platform, "ns.t", "run-b", items)
    assert third.mine == items and not third.taken
    assert coordination.forget_dead_leases(platform, "ns.t") == ["audit_run_a"]
    # a lease on another host is alive until its heartbeat is older than the TTL
    coordination.hold_lease(platform, "run-c", "ns.t")
    coordination._HEARTBEAT.remove(platform.store.engine, "audit_run_c", "ns.t")
    with platform.store.engine.begin() as conn:
        conn.execute(sa.update(coordination.run_leases).where(coordination.run_leases.c.run_key == "audit_run_c")
                     .values(host="elsewhere"))
    assert "audit_run_c" in coordination.live_runs(platform, "ns.t")
    with platform.store.engine.begin() as conn:
        conn.execute(sa.update(coordination.run_leases).where(coordination.run_leases.c.run_key == "audit_run_c")
                     .values(heartbeat_at=time.time() - coordination.lease_ttl_s() - 1))
    assert "audit_run_c" not in coordination.live_runs(platform, "ns.t")
    coordination.release_lease(platform, "run-b", "ns.t")
    assert coordination.claim(platform, "ns.t", "run-d", items).mine == items  # released with the lease


def test_publish_lock_serialises_threads(settings):
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    order: list[str] = []
    inside = threading.Event()

    def holder():
        with coordination.publish_lock(platform, "ns.t") as got:
            assert got
            order.append("first in")
            inside.set()
            time.sleep(0.5)
            order.append("first out")

    t = threading.Thread(target=holder)
    t.start()
    inside.wait(10)
    with coordination.publish_lock(platform, "ns.t") as got:
        order.append("second in")
    t.join()
    assert got and order == ["first in", "first out", "second in"]


@pytest.mark.slow  # starts a subprocess
def test_publish_lock_dies_with_its_holder(settings, tmp_path):
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    marker = tmp_path / "locked"
    code = ("import os, sys, time\n"
            "from lakehouse.metadata.store import MetadataStore\n"
            "from lakehouse.stage.runner import Platform\nfrom lakehouse.settings import load_settings\n"
            "from lakehouse.runtime import coordination\n"
            "s = load_settings(); p = Platform(s, MetadataStore(s.control_db_url))\n"
            "with coordination.publish_lock(p, 'ns.t'):\n"
            f"    open({str(marker)!r}, 'w').close(); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with coordination.publish_lock(platform, "ns.t", wait_s=0.5) as got:
            assert not got  # held by the other process
        proc.kill()  # kill -9
        proc.wait()
        with coordination.publish_lock(platform, "ns.t", wait_s=5) as got:
            assert got
    finally:
        if proc.poll() is None:
            proc.kill()



def test_an_unreachable_database_is_waited_for_then_named_without_its_password(monkeypatch):
    monkeypatch.setenv(outage.ENV_WINDOW, "0.7")  # the window is operational metadata: short here
    port = free_port()
    engine = sa.create_engine(f"postgresql+psycopg2://etl:s3cret-pw@127.0.0.1:{port}/control", pool_pre_ping=True)
    outage.install_connect_hook(engine, role="control DB")
    t0 = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as err:
        engine.connect()
    assert time.monotonic() - t0 >= 0.65  # it waited (with backoff) for the window
    text = str(err.value)
    assert f"control DB 127.0.0.1:{port}/control" in text and "s3cret-pw" not in text and "etl" not in text
    assert "outage.window_seconds" in text and "re-run" in text
    info = classify(err.value)
    assert info.code == DATABASE_UNAVAILABLE and not info.retryable


def test_an_outage_shorter_than_the_window_is_ridden_out(monkeypatch):
    monkeypatch.setenv(outage.ENV_WINDOW, "30")
    port = free_port()
    server = socket.socket()

    def come_back():
        time.sleep(0.3)  # the "database" starts listening again (the first retry is 0.5 s after the failure)
        server.bind(("127.0.0.1", port))
        server.listen(1)

    threading.Thread(target=come_back, daemon=True).start()
    attempts = []

    def connect():
        attempts.append(time.monotonic())
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "connected"

    try:
        assert outage.ride_out(connect, database=f"127.0.0.1:{port}/db", what="testing") == "connected"
    finally:
        server.close()
    assert len(attempts) >= 2 and attempts[-1] - attempts[0] >= 0.3


def test_only_connection_failures_are_waited_for():
    assert outage.is_connection_failure(RuntimeError("FATAL: the database system is shutting down"))
    assert outage.is_connection_failure(RuntimeError("Connection to 127.0.0.1:5432 refused. Check that ..."))
    assert not outage.is_connection_failure(ValueError("duplicate key value violates unique constraint"))
    calls = []
    with pytest.raises(ValueError):
        outage.ride_out(lambda: calls.append(1) or (_ for _ in ()).throw(ValueError("bad")), database="d", what="w")
    assert calls == [1]
    assert outage.describe_url("postgresql+psycopg2://u:pw@db.example:5432/ctl?sslmode=require") == "db.example:5432/ctl"
    assert outage.describe_url("jdbc:postgresql://h:5/cat") == "h:5/cat"


def test_s3_cursor_never_moves_past_a_file_another_run_loads():
    from lakehouse.ingest.files import FileRef
    from lakehouse.ingest.s3 import _handled_prefix_end

    new = [FileRef(k, 1, "e") for k in ("a", "b", "c", "d")]
    assert _handled_prefix_end(new, [new[0], new[1], new[3]]) == "b"  # c is another run's
    assert _handled_prefix_end(new, [new[1]]) is None
    assert _handled_prefix_end(new, new) == "d"
