"""kill -9 at two points (test_checkpoint_crash.py has three more), then a rerun: no branch of a
dead run remains, no quarantined row is lost or doubled, the files only a dead branch held are
deleted, and `lakehouse branches list` shows only failed audits within their retention; `lakehouse branches prune` drops expired ones
and, with --orphans, files no commit references once they are old enough.

Every run is a real `lakehouse run` process (its own JVM) on an embedded SQLite catalog and
control DB, with the three-source pipeline of tests/concurrency_kit.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from tests import concurrency_kit as kit

pytestmark = pytest.mark.slow

RULE = "      - {name: v_not_negative, type: expression, expression: \"v >= 0\", severity: error}\n"


@pytest.fixture
def lake(tmp_path, lake_home, s3_server, postgres_server, unique_ns):
    home = tmp_path / "home"
    home.mkdir()
    src_db = postgres_server.create_database()
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": "lake",
           "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
           "LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
           "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}",
           "LAKEHOUSE_S3_ENDPOINT_URL": s3_server.endpoint_url,
           "CONC_SRC_USER": postgres_server.user, "CONC_SRC_PASSWORD": postgres_server.password,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    conn = postgres_server.connect(src_db)
    conn.autocommit = True
    kit.create_source_table(conn)
    bucket = s3_server.new_bucket("hyg")

    class Lake:
        pass

    lk = Lake()
    lk.env, lk.home, lk.ns, lk.src, lk.s3, lk.bucket = env, home, unique_ns, conn, s3_server.client(), bucket
    lk.store = MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"])
    lk.expected = kit.Expected()

    def apply(settings: dict[str, str] | None = None) -> None:
        text = kit.metadata(unique_ns, bucket, postgres_server.jdbc_url(src_db), settings)
        text = text.replace("severity: warn, action: quarantine}\n", "severity: warn, action: quarantine}\n" + RULE)
        f = tmp_path / "hyg.yaml"
        f.write_text(text)
        lk.store.apply(load_metadata(f))

    lk.apply = apply
    lk.catalog = lambda: SqlCatalog("lake", uri=env["LAKEHOUSE_CATALOG_URI"], warehouse=env["LAKEHOUSE_WAREHOUSE"])
    yield lk
    conn.close()


def land(lk, tag: str) -> None:
    kit.land_files(lk.home / "landing" / "events", tag, n_files=4, rows=10, expected=lk.expected)
    kit.put_s3(lk.s3, lk.bucket, tag, n_files=2, rows=10, expected=lk.expected)
    kit.insert_rows(lk.src, len(lk.expected.jdbc) + 1, 30, lk.expected)


def killed_at(lk, tmp_path, point: str) -> None:
    marker = tmp_path / f"crash-{point}"
    marker.unlink(missing_ok=True)
    env = kit.run_env(lk.env, LAKEHOUSE_CRASH_AT=point, LAKEHOUSE_CRASH_MARKER=str(marker))
    (proc, log), = kit.start_runs(1, env, tmp_path / "logs", tag=f"kill-{point}")
    deadline = time.monotonic() + 900
    while not marker.exists():
        assert proc.poll() is None, f"ended before {point}: {log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"never reached {point}"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 the run and its JVM
    assert proc.wait(timeout=60) == -signal.SIGKILL


def run_to_end(lk, tmp_path, tag: str) -> tuple[int, str]:
    return kit.wait_runs(kit.start_runs(1, kit.run_env(lk.env), tmp_path / "logs", tag=tag), timeout=1200)[0]


def cli(lk, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "lakehouse.cli", *args], env=kit.run_env(lk.env),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def branch_files(cat, ident: str, branch: str) -> list[Path]:
    """Data files the branch's own commits added (what only it references)."""
    table = cat.load_table(ident)
    md = table.metadata
    on_main = set()
    snap = table.current_snapshot()
    while snap is not None:
        on_main.add(snap.snapshot_id)
        snap = md.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    out = []
    snap = md.snapshot_by_id(md.refs[branch].snapshot_id)
    while snap is not None and snap.snapshot_id not in on_main:
        for m in snap.manifests(table.io):
            if m.added_snapshot_id == snap.snapshot_id:
                out += [Path(e.data_file.file_path.replace("file:", "", 1))
                        for e in m.fetch_manifest_entry(table.io) if e.snapshot_id == snap.snapshot_id]
        snap = md.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id else None
    return out


@pytest.mark.timeout(3600)
def test_dead_runs_leave_nothing_behind_and_failed_audits_stay_for_their_retention(lake, tmp_path):
    lake.apply()
    files_t, q_t = kit.TABLES["files"].format(ns=lake.ns), kit.TABLES["files"].format(ns=lake.ns) + "__quarantine"
    land(lake, "a")
    killed_at(lake, tmp_path, "after_branch_commit")  # the JDBC stage published, files wrote a commit on its branches
    cat = lake.catalog()
    dead = [b for b in cat.load_table(files_t).metadata.refs if b.startswith("audit_")]
    assert len(dead) == 1
    orphaned = branch_files(cat, files_t, dead[0])
    assert orphaned and all(p.exists() for p in orphaned)

    land(lake, "b")
    killed_at(lake, tmp_path, "between_publishes")  # data published, its quarantine rows not yet
    cat = lake.catalog()
    assert dead[0] not in cat.load_table(files_t).metadata.refs  # dropped by the next run of the stage
    assert not any(p.exists() for p in orphaned)  # and the files only its commits held are gone
    pending = [b for b in cat.load_table(q_t).metadata.refs if b.startswith("audit_")]
    assert len(pending) == 1

    rc, out = run_to_end(lake, tmp_path, "rerun")
    assert kit.succeeded(rc, out), out[-6000:]
    cat = lake.catalog()
    assert kit.check_exactly_once(cat, lake.ns, lake.expected) == {}  # incl. the completed quarantine publish
    for ident in [*(t.format(ns=lake.ns) for t in kit.TABLES.values()), q_t]:
        assert set(cat.load_table(ident).metadata.refs) == {"main"}, ident
    tidied = lake.store.audit_entries(event="branches_tidied", limit=1000)
    assert any(b["state"] == "published" for e in tidied for b in e.details["branches"])  # the quarantine one

    # a failed audit: its branch stays, listed with its retention; prune drops it once expired
    bad = lake.home / "landing" / "events" / "z-bad.jsonl"
    bad.write_text('{"id": "bad-1", "v": -1}\n')
    rc, out = run_to_end(lake, tmp_path, "failed-audit")
    assert rc != 0 and "v_not_negative" in out
    listing = cli(lake, "branches", "list")
    rows = [ln for ln in listing.splitlines() if ln.startswith(files_t + " ")]
    assert len(rows) == 1 and "failed_audit" in rows[0] and "UTC" in rows[0]  # kept until (7 days)
    assert "(none)" not in listing and "dead" not in listing
    lake.apply({"branches.retention_days": "0"})
    assert "audit_" in cli(lake, "branches", "prune")
    assert set(lake.catalog().load_table(files_t).metadata.refs) == {"main"}

    # files no commit references: removed by the orphan sweep once older than the minimum age
    data_dir = Path(cat.load_table(files_t).location().replace("file:", "", 1)) / "data"
    old, young = data_dir / "stray-old.parquet", data_dir / "stray-young.parquet"
    for p in (old, young):
        p.write_bytes(b"PAR1 not referenced by any commit")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    report = cli(lake, "branches", "prune", "--orphans")
    assert not old.exists() and young.exists()
    assert "orphan_files_removed" in report
    assert kit.check_exactly_once(lake.catalog(), lake.ns, lake.expected) == {}  # every live file still there


def unreferenced_data_files(cat, ident: str) -> set[Path]:
    """Files under the table's data folder that no snapshot of the table references (any branch,
    any older snapshot still listed): read independently, with PyIceberg."""
    table = cat.load_table(ident)
    referenced: set[Path] = set()
    seen_manifests: set[str] = set()
    for snap in table.metadata.snapshots:
        for m in snap.manifests(table.io):
            if m.manifest_path in seen_manifests:
                continue
            seen_manifests.add(m.manifest_path)
            referenced |= {Path(e.data_file.file_path.replace("file:", "", 1))
                           for e in m.fetch_manifest_entry(table.io, discard_deleted=False)}
    data_dir = Path(table.location().replace("file:", "", 1)) / "data"
    on_disk = {p for p in data_dir.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))} \
        if data_dir.exists() else set()  # not Hadoop's hidden .crc files
    return on_disk - referenced


@pytest.mark.timeout(3600)
def test_the_files_of_a_commit_that_never_landed_are_removed_by_the_next_run(lake, tmp_path, postgres_server):
    """kill -9 while the run's commit waits on the catalog (its data files written, the commit
    never lands): the next run of the stage removes exactly those files, and keeps every file a
    live snapshot or branch references, a failed audit's branch kept for its retention included.
    The catalog is on PostgreSQL here: the test holds the table's catalog row locked, so the
    commit waits (on SQLite it would fail at once, and Iceberg would delete its own files)."""
    pg = postgres_server
    catalog_db = pg.create_database()
    lake.env.update({"LAKEHOUSE_CATALOG_URI": f"postgresql://{pg.host}:{pg.port}/{catalog_db}",
                     "LAKEHOUSE_CATALOG_USER": pg.user, "LAKEHOUSE_CATALOG_PASSWORD": pg.password})
    lake.catalog = lambda: SqlCatalog("lake", uri=pg.sqlalchemy_url(catalog_db),
                                      warehouse=lake.env["LAKEHOUSE_WAREHOUSE"])
    lake.apply()
    ns, files_t = f"bronze_{lake.ns}", kit.TABLES["files"].format(ns=lake.ns)
    land(lake, "a")
    bad = lake.home / "landing" / "events" / "z-bad.jsonl"
    bad.write_text('{"id": "bad-1", "v": -1}\n')
    rc, out = run_to_end(lake, tmp_path, "failed-audit")
    assert rc != 0 and "v_not_negative" in out, out[-6000:]
    cat = lake.catalog()
    kept = [b for b in cat.load_table(files_t).metadata.refs if b.startswith("audit_")]
    assert len(kept) == 1
    kept_files = branch_files(cat, files_t, kept[0])
    assert kept_files and all(p.exists() for p in kept_files)
    bad.unlink()
    land(lake, "b")

    # the run's files stage commits its first batch on its branch, then writes its second batch's
    # files and waits on the catalog row the test holds locked: kill -9 there
    pause = tmp_path / "pause"
    pause.mkdir()
    env = kit.run_env(lake.env, LAKEHOUSE_PAUSE_AT="after_branch_commit@files", LAKEHOUSE_PAUSE_DIR=str(pause))
    (proc, log), = kit.start_runs(1, env, tmp_path / "logs", tag="kill-at-commit")
    data_dir = Path(cat.load_table(files_t).location().replace("file:", "", 1)) / "data"
    lock = pg.connect(catalog_db)
    try:
        deadline = time.monotonic() + 900
        while not list(pause.glob("after_branch_commit@files.*")):
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "never reached the second batch"
            time.sleep(0.2)
        before = set(data_dir.rglob("*.parquet"))
        with lock.cursor() as cur:  # the run's next commit of the table waits for this row
            cur.execute("SELECT 1 FROM iceberg_tables WHERE table_namespace = %s AND table_name = %s FOR UPDATE",
                        (ns, "file_events"))
            assert cur.rowcount == 1
        (pause / "release").touch()
        deadline = time.monotonic() + 300
        while not set(data_dir.rglob("*.parquet")) - before:
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the second batch wrote no file"
            time.sleep(0.2)
        time.sleep(3)  # every task's file written; the commit is waiting on the row
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        with lock.cursor() as cur:  # a server backend waiting on a lock does not notice its client die:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "  # it would commit once let go
                        "WHERE datname = %s AND pid <> pg_backend_pid()", (catalog_db,))
    finally:
        kit.kill_all([(proc, log)])
        lock.rollback()
        lock.close()

    cat = lake.catalog()
    never_landed = unreferenced_data_files(cat, files_t)
    assert never_landed, "the killed commit left no file behind: nothing to prove"
    assert not never_landed & set(kept_files)
    rc, out = run_to_end(lake, tmp_path, "next")
    assert kit.succeeded(rc, out), out[-6000:]
    cat = lake.catalog()
    assert not any(p.exists() for p in never_landed)  # removed by this run, not in a day
    assert unreferenced_data_files(cat, files_t) == set()
    assert kept[0] in cat.load_table(files_t).metadata.refs  # the failed audit's branch stays...
    assert all(p.exists() for p in kept_files)  # ...with its files
    assert kit.check_exactly_once(cat, lake.ns, lake.expected) == {}
    tidied = lake.store.audit_entries(event="branches_tidied", limit=1000)
    assert tidied, "the next run found no dead run"
