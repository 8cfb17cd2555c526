"""The decisive check at publish, run by run, with real Spark and Iceberg in one process: runs
that planned the same input publish it once — the second publishes only the rest (files, a JDBC
window) or nothing — with "N files already loaded by run R" in the audit log and the metadata;
quarantine rows follow their data; concurrent entity_raw loads of the same files write them once.

Claims are switched off here (`claims.enabled: false`) so that every run plans everything and the
publish check alone has to keep the rows exactly once.
"""

from __future__ import annotations

import io
import json
import threading
from collections import Counter
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.stage import entity_raw
from lakehouse.stage.runner import StageRunner

pytestmark = pytest.mark.slow

FILES = """
pipelines:
  - {{pipeline_id: ev}}
sources:
  - {{source_id: ev_files, kind: files, format: jsonl, path: ev, glob: "*.jsonl", batch_files: 1,
     columns: [{{name: id, type: bigint}}, {{name: v, type: string}}]}}
targets:
  - {{target_id: ev_bronze, namespace: b_{ns}, table: ev}}
stages:
  - {{pipeline_id: ev, stage_order: 1, stage_name: ingest, layer: bronze, source_id: ev_files,
     target_id: ev_bronze, validation_set_id: ev_rules}}
validation_rules:
  - rule_set_id: ev_rules
    rules:
      - {{name: id_present, type: not_null, columns: [id], severity: warn, action: quarantine}}
platform_settings:
  - {{setting_key: claims.enabled, setting_value: "false"}}
"""


def pycat(platform) -> SqlCatalog:
    s = platform.settings
    return SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)


def land(platform, name: str, ids: list[int | None]) -> None:
    d = platform.settings.landing_dir / "ev"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text("".join(json.dumps({"id": i, "v": f"{name}-{n}"}) + "\n" for n, i in enumerate(ids)))


def column(platform, ident: str, name: str) -> Counter:
    return Counter(pycat(platform).load_table(ident).scan(selected_fields=(name,)).to_arrow().column(name).to_pylist())


def test_second_run_publishes_only_what_the_first_did_not(platform, tmp_path, unique_ns):
    meta = tmp_path / "ev.yaml"
    meta.write_text(FILES.format(ns=unique_ns))
    platform.store.apply(load_metadata(meta))
    ident = f"b_{unique_ns}.ev"
    land(platform, "f1.jsonl", [1, 2, None])
    land(platform, "f2.jsonl", [3, 4, None])

    a = StageRunner(platform, "ev", "ingest", "run_a")
    plan_a = a.extract()
    land(platform, "f3.jsonl", [5, None])
    b = StageRunner(platform, "ev", "ingest", "run_b")
    plan_b = b.extract()
    c = StageRunner(platform, "ev", "ingest", "run_c")
    plan_c = c.extract()
    assert [f.key for f in plan_a.files] == ["f1.jsonl", "f2.jsonl"]
    assert [f.key for f in plan_b.files] == [f.key for f in plan_c.files] == ["f1.jsonl", "f2.jsonl", "f3.jsonl"]

    out_a = a.load(plan_a)
    assert out_a.rows_written == 4 and out_a.quarantined_rows == 2
    out_b = b.load(plan_b)  # f1, f2 are on main now: only f3 is written again and published
    assert out_b.published and out_b.rows_written == 1 and out_b.quarantined_rows == 1
    md = out_b.metadata()
    assert md["already_loaded"] == "2 file(s) already loaded by run run_a" and md["files_already_loaded"] == 2
    out_c = c.load(plan_c)  # everything it planned is on main: nothing published, success
    assert out_c.published and out_c.rows_written == 0
    assert "already loaded by run run_a" in out_c.skipped_reason and "by run run_b" in out_c.skipped_reason

    assert column(platform, ident, "id") == Counter({1: 1, 2: 1, 3: 1, 4: 1, 5: 1})
    q = column(platform, f"{ident}__quarantine", "v")  # quarantine rows follow their data: once each
    assert q == Counter({"f1.jsonl-2": 1, "f2.jsonl-2": 1, "f3.jsonl-1": 1})
    for t in (ident, f"{ident}__quarantine"):
        assert set(pycat(platform).load_table(t).metadata.refs) == {"main"}  # no branch left behind
    events = [(e.run_id, e.message) for e in platform.store.audit_entries(event="already_loaded")]
    assert ("run_b", "2 file(s) already loaded by run run_a") in events
    assert any(r == "run_c" and "run_b" in m for r, m in events)


@pytest.fixture
def pg_source(postgres_server, monkeypatch):
    name = postgres_server.create_database()
    monkeypatch.setenv("SRC_USER", postgres_server.user)
    monkeypatch.setenv("SRC_PASSWORD", postgres_server.password)
    conn = postgres_server.connect(name)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE events (id bigint PRIMARY KEY, updated_at timestamp NOT NULL, v text)")

    def insert(ids):
        with conn.cursor() as cur:
            for i in ids:
                cur.execute("INSERT INTO events VALUES (%s, %s, %s)",
                            (i, datetime(2024, 1, 1) + timedelta(minutes=i), f"v{i}"))

    yield postgres_server.jdbc_url(name), insert
    conn.close()


JDBC = """
pipelines:
  - {{pipeline_id: db}}
sources:
  - {{source_id: pg_events, kind: jdbc, jdbc_url: "{url}", user_env: SRC_USER, password_env: SRC_PASSWORD,
     table: events, load_type: incremental, watermark_column: updated_at, primary_key: [id]}}
targets:
  - {{target_id: db_bronze, namespace: j_{ns}, table: events, write_mode: merge, merge_keys: [id]}}
stages:
  - {{pipeline_id: db, stage_order: 1, stage_name: ingest, layer: bronze, source_id: pg_events, target_id: db_bronze}}
platform_settings:
  - {{setting_key: claims.enabled, setting_value: "false"}}
"""


@pytest.mark.postgres
def test_a_jdbc_window_another_run_published_is_not_merged_again(platform, tmp_path, unique_ns, pg_source):
    url, insert = pg_source
    meta = tmp_path / "db.yaml"
    meta.write_text(JDBC.format(url=url, ns=unique_ns))
    platform.store.apply(load_metadata(meta))
    ident = f"j_{unique_ns}.events"
    insert(range(1, 11))
    a = StageRunner(platform, "db", "ingest", "run_a")
    plan_a = a.extract()  # rows 1..10
    insert(range(11, 16))
    b = StageRunner(platform, "db", "ingest", "run_b")
    plan_b = b.extract()  # rows 1..15, from the same committed watermark
    assert plan_a.details["rows_read"] == 10 and plan_b.details["rows_read"] == 15
    assert a.load(plan_a).published
    out_b = b.load(plan_b)
    assert out_b.published and "already loaded by run run_a" in out_b.extra["already_loaded"]
    assert out_b.rows_written == 5  # only the rows after run_a's watermark were merged
    assert column(platform, ident, "id") == Counter({i: 1 for i in range(1, 16)})
    table = pycat(platform).load_table(ident)
    head = table.current_snapshot().summary.additional_properties
    assert json.loads(head["lakehouse.jdbc.watermark"])["value"].startswith("2024-01-01T00:15")
    c = StageRunner(platform, "db", "ingest", "run_c")
    assert c.extract().skipped_reason  # nothing new after the published watermark


APPS = """
sources:
  - source_id: app_files
    kind: files
    format: parquet
    path: extract
    glob: "*.parquet"
    options: {{tenant_id: acme, connection_qualified_name: "default/pg/1"}}
applications:
  - {{application_id: app_{ns}, source_id: app_files}}
"""


def test_concurrent_entity_raw_loads_of_the_same_files_write_them_once(platform, tmp_path, unique_ns, monkeypatch):
    meta = tmp_path / "apps.yaml"
    meta.write_text(APPS.format(ns=unique_ns))
    platform.store.apply(load_metadata(meta))
    root = platform.settings.landing_dir / "extract"
    for typename, n in (("table", 3), ("column", 4)):
        path = root / "wf" / "run1" / "raw" / typename / "chunk-0.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist([{"name": f"{typename}_{i}"} for i in range(n)]), buf)
        path.write_bytes(buf.getvalue())
    # both loads plan before either commits: the second finds the files on main at publish
    both_planned = threading.Barrier(2, timeout=300)
    real_commit = entity_raw._commit

    def commit_after_both_planned(*args, **kwargs):
        try:
            both_planned.wait()
        except threading.BrokenBarrierError:
            pass  # the reload of the remainder comes back here alone
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(entity_raw, "_commit", commit_after_both_planned)
    results, errors = {}, []

    def load(run_id):
        try:
            results[run_id] = entity_raw.load_new_files(platform, f"app_{unique_ns}", run_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
            both_planned.abort()

    threads = [threading.Thread(target=load, args=(r,)) for r in ("load_a", "load_b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    assert sorted(r.files_loaded for r in results.values()) == [0, 2]
    assert sorted(r.files_skipped for r in results.values()) == [0, 2]
    rows = pycat(platform).load_table(entity_raw.table_identifier(f"app_{unique_ns}")).scan().to_arrow()
    assert rows.num_rows == 7 and len(set(rows.column("raw_record").to_pylist())) == 7
    events = platform.store.audit_entries(event="already_loaded")
    assert len(events) == 1 and "2 file(s) already loaded by run load_" in events[0].message
