"""kill -9 at several points of an S3 ingest run, then run again: every row lands exactly once.

Each run is a real subprocess (its own Spark JVM) against the test's control DB, Iceberg catalog
and moto_server. The run stops at a named point (`LAKEHOUSE_CRASH_AT`), writes a marker, and the
test kills its whole process group with SIGKILL. The next run must recover: unpublished branch
commits are ignored, published-but-unrecorded files are found in the snapshot summaries.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.ingest.checkpoints import Checkpoints
from tests.test_s3_ingest import apply_pipeline, log_rows, parquet_bytes

RUN = """
import json
from lakehouse.stage.runner import Platform, StageRunner
p = Platform.from_env()
r = StageRunner(p, "wf_logs", "ingest")
plan = r.extract()
out = r.load(plan)
print("RESULT " + json.dumps({"rows": out.rows_written, "skipped": out.skipped_reason}))
"""


def _env(crash_at: str | None, marker) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LAKEHOUSE_CRASH_AT"}
    env.update({"LAKEHOUSE_SPARK_MASTER": "local[1]", "LAKEHOUSE_SPARK_DRIVER_MEMORY": "1g",
                "LAKEHOUSE_SHUFFLE_PARTITIONS": "1", "PYTHONUNBUFFERED": "1"})
    if crash_at:
        env["LAKEHOUSE_CRASH_AT"] = crash_at
        env["LAKEHOUSE_CRASH_MARKER"] = str(marker)
    return env


def run_killed_at(point: str, tmp_path) -> None:
    marker = tmp_path / f"crash-{point}.marker"
    marker.unlink(missing_ok=True)  # the same point may be used twice
    log = (tmp_path / f"run-{point}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", RUN], env=_env(point, marker), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"run ended before reaching {point}: {(tmp_path / f'run-{point}.log').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"run never reached {point}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 the run and its JVM
    assert proc.wait(timeout=60) == -signal.SIGKILL


def run_to_end(tmp_path, name: str) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", RUN], env=_env(None, None), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    (tmp_path / f"run-{name}.log").write_text(out)
    assert proc.returncode == 0, out[-4000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
@pytest.mark.timeout(3600)  # five cold Spark JVMs in subprocesses; minutes each on a busy 2-core box
def test_kill9_at_several_points_then_rerun_is_exactly_once(platform, s3_server, tmp_path, unique_ns, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    ident = apply_pipeline(platform, tmp_path, bucket, unique_ns)  # batch_files: 2
    s = platform.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    expected: list[str] = []

    def land(tag: str, n_files: int) -> None:
        for i in range(n_files):
            rows = log_rows(i, 3)
            for r in rows:
                r["message"] = f"{tag}-{r['message']}"
            expected.extend(r["message"] for r in rows)
            client.put_object(Bucket=bucket, Key=f"logs/{tag}/part-{i}.parquet", Body=parquet_bytes(rows))

    def messages() -> Counter:
        if not cat.table_exists(ident):
            return Counter()
        return Counter(cat.load_table(ident).scan(selected_fields=("message",)).to_arrow().column("message").to_pylist())

    # 1. killed while downloading: nothing reaches the table
    land("a", 3)
    run_killed_at("download", tmp_path)
    assert messages() == Counter()

    # 2. killed after the first batch commit on the audit branch, before publish: main unchanged
    land("b", 2)
    run_killed_at("after_branch_commit", tmp_path)
    assert messages() == Counter()
    table = cat.load_table(ident)
    assert any(name.startswith("audit_") for name in table.metadata.refs)  # the orphan branch holds data

    # 3. killed right after publish, before the checkpoint-table write: rows are on main once,
    #    the checkpoint table does not know them yet
    land("c", 2)
    run_killed_at("after_publish", tmp_path)
    assert messages() == Counter(expected)
    assert Checkpoints(platform, ident).counts().get("processed", 0) == 0

    # the rerun recovers from the summaries: nothing is read twice, every row exactly once
    res = run_to_end(tmp_path, "rerun")
    assert res["skipped"] and res["rows"] == 0
    assert messages() == Counter(expected) and all(n == 1 for n in messages().values())
    assert Checkpoints(platform, ident).counts() == {"processed": 7}

    # and a kill after publish of new files followed by a rerun that also has new files
    land("d", 1)
    run_killed_at("after_publish", tmp_path)
    land("e", 1)
    res = run_to_end(tmp_path, "rerun2")
    assert res["rows"] == 3  # only e's rows: d was published before the kill
    assert messages() == Counter(expected) and all(n == 1 for n in messages().values())
    assert Checkpoints(platform, ident).counts() == {"processed": 9}
