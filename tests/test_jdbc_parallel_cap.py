"""Seed 004's cap (issue 43 item 4): `max_parallel_queries` on a partitioned JDBC read is enforced
inside the read. A real PostgreSQL is sampled (`pg_stat_activity`, every few ms) while the platform
reads a table whose every query takes a while: the partition queries open at once never exceed the
cap, and every row lands exactly once."""

from __future__ import annotations

import threading
import time

import psycopg2
import pytest

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.stage.runner import StageRunner
from tests import test_jdbc
from tests.test_jdbc import apply_yaml, iceberg_rows, pipeline_doc

src_db = test_jdbc.src_db  # the fixtures of the JDBC tests: a fresh database and a reader role
_remember_server = test_jdbc._remember_server

ROWS = 800


class Sampler(threading.Thread):
    """Polls pg_stat_activity for the reader role's active queries on the slow view."""

    def __init__(self, server, db):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(host=server.host, port=server.port, dbname=db.name, user=db.user,
                                     password=db.password)
        self.conn.autocommit = True
        self.user = db.user
        self.stop = threading.Event()
        self.max_open = 0
        self.samples = 0

    def run(self) -> None:
        with self.conn.cursor() as cur:
            while not self.stop.is_set():
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND state = 'active' "
                            "AND pid <> pg_backend_pid() AND query LIKE %s", (self.user, "%slow_facts%"))
                self.max_open = max(self.max_open, cur.fetchone()[0])
                self.samples += 1
                time.sleep(0.005)
        self.conn.close()


def make_slow_table(src_db) -> None:
    """`slow_facts`: ROWS rows, every query on it (a partition's too) sleeping 0.5 s once."""
    src_db.execute("CREATE TABLE facts AS SELECT g AS id, md5(g::text) AS payload FROM generate_series(1, %s) g",
                   (ROWS,))
    src_db.execute("ANALYZE facts")
    src_db.execute("CREATE VIEW slow_facts AS SELECT f.id, f.payload FROM facts f "
                   "CROSS JOIN (SELECT pg_sleep(0.5)) s")


def load(platform, postgres_server, src_db, tmp_path, pipeline_id: str, cap: int | None) -> tuple[int, dict]:
    source = {"source_id": f"src_{pipeline_id}", "table": "slow_facts", "partitioned": True,
              "partition_column": "id", "partition_size_rows": 100}
    if cap is not None:
        source["max_parallel_queries"] = cap
    apply_yaml(platform, tmp_path, pipeline_doc(
        src_db, source, {"target_id": f"t_{pipeline_id}", "table": pipeline_id, "write_mode": "overwrite"},
        pipeline_id=pipeline_id), f"{pipeline_id}.yaml")
    sampler = Sampler(postgres_server, src_db)
    sampler.start()
    try:
        runner = StageRunner(platform, pipeline_id, "ingest")
        plan = runner.extract()
        out = runner.load(plan)
    finally:
        sampler.stop.set()
        sampler.join()
    assert out.published and sampler.samples > 50
    ids = [r["id"] for r in iceberg_rows(platform, f"bronze.{pipeline_id}")]
    assert ids == list(range(1, ROWS + 1))  # every row exactly once
    return sampler.max_open, {**plan.details, "read_ranges": out.extra.get("read_ranges")}


@pytest.mark.slow
def test_max_parallel_queries_caps_the_open_partition_queries(platform, postgres_server, src_db, tmp_path):
    make_slow_table(src_db)
    slots = platform.spark().sparkContext.defaultParallelism

    seen, details = load(platform, postgres_server, src_db, tmp_path, "capped2", cap=2)
    assert details["ranges"]["num_partitions"] == 8 and details["ranges"]["mode"] == "predicates"
    assert details["waves"] == 4 and details["read_ranges"] == "predicates x8 in 4 waves of <= 2"
    assert 1 <= seen <= 2

    # the cap is the read's, not the machine's: below the session's task slots it still holds
    uncapped, _ = load(platform, postgres_server, src_db, tmp_path, "uncapped", cap=None)
    capped1, details1 = load(platform, postgres_server, src_db, tmp_path, "capped1", cap=1)
    assert details1["waves"] == 8
    print(f"max open partition queries: cap 2 -> {seen}, cap 1 -> {capped1}, uncapped -> {uncapped} "
          f"(task slots {slots})")
    assert capped1 == 1
    assert uncapped == min(slots, 8) > 1  # without a cap Spark opens a query per task slot


def test_max_parallel_queries_is_refused_where_it_cannot_hold(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("sources:\n  - {source_id: s, kind: jdbc, jdbc_url: 'jdbc:postgresql://h/db', table: t,\n"
                    "     max_parallel_queries: 2}\n")
    with pytest.raises(MetadataError, match="max_parallel_queries caps a partitioned jdbc read"):
        load_metadata(path)
    path.write_text("sources:\n  - {source_id: s, kind: jdbc, jdbc_url: 'jdbc:postgresql://h/db', table: t,\n"
                    "     partitioned: true, partition_column: id, max_parallel_queries: 2,\n"
                    "     options: {staging: 'false'}}\n")
    with pytest.raises(MetadataError, match="needs the staged copy"):
        load_metadata(path)
    path.write_text("sources:\n  - {source_id: s, kind: jdbc, jdbc_url: 'jdbc:postgresql://h/db', table: t,\n"
                    "     partitioned: true, partition_column: id, max_parallel_queries: 0}\n")
    with pytest.raises(MetadataError, match="max_parallel_queries"):
        load_metadata(path)
