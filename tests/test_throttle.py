"""Rate limits: the shared token bucket across processes, and the runner applying it per batch.

* Two OS processes drain one source's records_per_minute bucket in the control DB at the same
  time, each writing its own batches; together they achieve the limit within ±10 %.
* A real stage load (Spark writing Iceberg, one commit per batch) is paced by the source's
  limit: the commit timestamps of the audit branch are spread as the bucket dictates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from lakehouse.metadata.model import PlatformSetting
from lakehouse.stage.runner import Platform
from lakehouse.throughput.ratelimit import Bucket, StageThrottle, TokenBuckets, buckets, buckets_for

REPO = Path(__file__).resolve().parent.parent


def _metadata(tmp_path, platform, throttles, batch_files=1, burst="0.5"):
    from tests.test_pools import apply, throughput_metadata

    apply(platform, throughput_metadata({"p_a": "normal", "p_b": "normal"}, throttles, batch_files=batch_files),
          tmp_path / "m.yaml")
    platform.store.upsert([PlatformSetting(setting_key="throttle_burst_seconds", setting_value=burst)])


def worker(source_id: str, target_id: str, files: list[str], out: str, start_at: float) -> None:
    """One 'run': read each landing file as a batch, write it out, pay the source's/target's buckets."""
    platform = Platform.from_env()
    throttle = StageThrottle.for_stage(platform.store, platform.store.load(), source_id, target_id)
    assert throttle.active
    while time.time() < start_at:
        time.sleep(0.01)
    with open(out, "w") as log, open(out + ".data", "w") as sink:
        for f in files:
            throttle.before_batch()
            lines = Path(f).read_text().splitlines()
            sink.write("\n".join(lines) + "\n")
            sink.flush()
            log.write(json.dumps({"t": time.time(), "n": len(lines)}) + "\n")
            log.flush()
            throttle.after_batch(len(lines), Path(f).stat().st_size, Path(f).stat().st_size)


@pytest.mark.slow  # two worker processes for half a minute
def test_two_processes_share_one_bucket_within_10_percent(settings, tmp_path):
    from tests.test_pools import write_rows

    platform = Platform.from_env()
    limit = 3000.0  # records per minute = 50/s
    _metadata(tmp_path, platform, [{"throttle_id": "src_rpm", "entity_type": "source", "entity_id": "shared_src",
                                    "metric": "records_per_minute", "threshold": limit}])
    landing = settings.landing_dir / "shared"
    write_rows(landing, files=48, rows=25)  # 1200 records: ~24 s at the limit
    files = sorted(str(p) for p in landing.glob("*.jsonl"))
    start_at = time.time() + 8.0  # both processes import, then start together
    procs = []
    for i, (target, mine) in enumerate((("t_p_a", files[0::2]), ("t_p_b", files[1::2]))):
        code = ("import sys, json; sys.path.insert(0, sys.argv[1]); from tests.test_throttle import worker; "
                "worker(*json.loads(sys.argv[2]))")
        args = json.dumps(["shared_src", target, mine, str(tmp_path / f"w{i}.log"), start_at])
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(REPO), args], env=dict(os.environ)))
    for p in procs:
        assert p.wait(timeout=300) == 0

    events = sorted((json.loads(line) for i in range(2) for line in (tmp_path / f"w{i}.log").read_text().splitlines()),
                    key=lambda e: e["t"])
    per_worker = [len((tmp_path / f"w{i}.log").read_text().splitlines()) for i in range(2)]
    assert per_worker == [24, 24]
    # both processes were writing throughout (interleaved), not one after the other
    first_b = min(json.loads(x)["t"] for x in (tmp_path / "w1.log").read_text().splitlines())
    last_a = max(json.loads(x)["t"] for x in (tmp_path / "w0.log").read_text().splitlines())
    assert first_b < last_a
    span = events[-1]["t"] - events[0]["t"]
    achieved = sum(e["n"] for e in events[1:]) / span * 60.0
    print(f"two processes: achieved {achieved:.0f} records/min over {span:.1f} s (limit {limit:.0f})")
    assert abs(achieved - limit) / limit <= 0.10, f"achieved {achieved:.0f} records/min vs limit {limit:.0f}"
    # every record was written exactly once
    total = sum(len((tmp_path / f"w{i}.log.data").read_text().splitlines()) for i in range(2))
    assert total == 1200


def test_bucket_is_atomic_and_follows_metadata_changes(settings, tmp_path):
    platform = Platform.from_env()
    now = [1000.0]
    tb = TokenBuckets(platform.store, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    b = Bucket("source:x/records_per_minute", "records", rate_per_s=10.0, capacity=5.0)
    assert tb.charge(b, 5) == 0.0  # starts full
    assert tb.charge(b, 20) == -20.0  # debt
    assert tb.pay(b, 0) == pytest.approx(2.0)  # 20 records at 10/s
    assert tb.charge(b, 0) == pytest.approx(0.0)
    now[0] += 100
    assert tb.charge(b, 0) == pytest.approx(5.0)  # refill capped at capacity
    # a new threshold applies to the very next charge (rate/capacity come from current metadata)
    b2 = Bucket(b.key, "records", rate_per_s=1.0, capacity=1.0)
    assert tb.charge(b2, 0) == pytest.approx(1.0)
    with platform.store.engine.connect() as conn:
        assert conn.execute(sa.select(buckets.c.rate_per_s).where(buckets.c.bucket_key == b.key)).scalar() == 1.0

    _metadata(tmp_path, platform, [
        {"throttle_id": "r", "entity_type": "source", "entity_id": "shared_src", "metric": "records_per_minute",
         "threshold": 600},
        {"throttle_id": "b", "entity_type": "target", "entity_id": "t_p_a", "metric": "bytes_per_hour",
         "threshold": 3_600_000},
    ])
    cat = platform.store.load()
    (src,) = buckets_for(cat, "source", "shared_src")
    assert (src.unit, src.rate_per_s, src.capacity) == ("records", 10.0, 5.0)
    (tgt,) = buckets_for(cat, "target", "t_p_a")
    assert (tgt.unit, tgt.rate_per_s) == ("bytes", 1000.0)
    assert buckets_for(cat, "target", "t_p_b") == []


def test_stage_load_is_paced_per_batch(platform, tmp_path):
    """Real Spark + Iceberg: 6 one-file batches of 50 rows under 300 records/min (5/s)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.stage.runner import StageRunner
    from tests.test_pools import write_rows

    settings = platform.settings
    _metadata(tmp_path, platform, [{"throttle_id": "src_rpm", "entity_type": "source", "entity_id": "shared_src",
                                    "metric": "records_per_minute", "threshold": 300}])
    write_rows(settings.landing_dir / "shared", files=6, rows=50)
    runner = StageRunner(platform, "p_a", "ingest")
    outcome = runner.load(runner.extract())
    assert outcome.published and outcome.rows_written == 300 and len(outcome.writes) == 6
    # the limiter, not Spark's speed, set the pace: it made the load wait (reported as metadata)
    assert outcome.metadata()["throttle_wait_s"] > 0

    table = SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse).load_table(
        "bronze.p_a")
    snaps = sorted((s for s in table.snapshots() if s.summary and s.summary.get("added-records")),
                   key=lambda s: s.timestamp_ms)
    assert len(snaps) == 6
    spread_s = (snaps[-1].timestamp_ms - snaps[0].timestamp_ms) / 1000.0
    # after the first commit, 250 more records at 5/s, less a 2.5-record burst: >= 49.5 s apart
    assert spread_s >= (250 - 2.5) / 5.0 * 0.98, spread_s
    with platform.store.engine.connect() as conn:
        row = conn.execute(sa.select(buckets.c.rate_per_s).where(
            buckets.c.bucket_key == "source:shared_src/records_per_minute")).first()
    assert row is not None and row[0] == pytest.approx(5.0)
