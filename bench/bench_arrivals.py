"""Arrival and rerun costs against a real HTTP S3 endpoint (moto_server), side by side with baselines.

A. Sensor tick with N existing keys and 10 new ones:
   `lakehouse.ingest.s3.poll_s3` (StartAfter cursor) vs `dagster_aws.s3.sensor.get_objects`
   (lists the whole prefix on every call).
B. A run over P already-processed files (default 10,000) plus 10 new ones vs a run over just the
   10 new files on a fresh table (goal: <= 1.5x), real Spark + Iceberg.

    .venv/bin/python bench/bench_arrivals.py                      # 10,000 keys, 10,000 processed files
    .venv/bin/python bench/bench_arrivals.py --keys 100000 --repeat 1 --skip-rerun   # the issue's size

moto answers every ListObjectsV2 by sorting the whole bucket (real S3 does not), so on moto even
the one-request tick grows with the bucket; the request count is the machine-independent figure.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def start_moto():
    """moto's S3 in this process (ThreadedMotoServer): a real HTTP endpoint on loopback whose backend
    we can also fill directly — 100,000 PUTs over HTTP take most of an hour on a small machine, and
    filling the bucket is set-up, not what is measured. Every measured call goes over HTTP."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
            return url, server
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    server.stop()
    raise RuntimeError("moto server did not start")


def put_many(client, bucket: str, keys: list[str], body_for=lambda k: b"x", threads: int = 32) -> float:
    """Fill the bucket through moto's backend (same process as the HTTP server)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    t0 = time.monotonic()
    for k in keys:
        backend.put_object(bucket, k, body_for(k))
    return time.monotonic() - t0


def put_http(client, bucket: str, keys: list[str], body_for=lambda k: b"x", threads: int = 16) -> float:
    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=body_for(k)), keys))
    return time.monotonic() - t0


def timed(fn, repeat: int = 3) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_sensor(platform, client, n_keys: int, repeat: int = 3) -> dict:
    from dagster_aws.s3.sensor import get_objects

    from lakehouse.ingest.s3 import poll_s3
    from lakehouse.metadata.model import Source

    bucket = "bench-sensor"
    client.create_bucket(Bucket=bucket)
    keys = [f"logs/dt=2026-11-{1 + i // 10000:02d}/part-{i:07d}.parquet" for i in range(n_keys)]
    print(f"[A] uploading {n_keys:,} keys ...", flush=True)
    up = put_many(client, bucket, keys)
    print(f"[A] uploaded in {up:.1f}s", flush=True)
    src = Source(source_id="bench_sensor", kind="s3", format="parquet", bucket=bucket, prefix="logs/",
                 glob="*.parquet", max_files_per_run=1000)
    calls = {"n": 0}

    def count(**_kw):
        calls["n"] += 1

    # `client` is the platform's own (S3Clients caches one per endpoint): poll_s3 lists with it,
    # so its list requests can be counted
    client.meta.events.register("before-call.s3.ListObjectsV2", count)
    try:
        t0 = time.perf_counter()
        first = poll_s3(platform, src, None, None)
        t_full = time.perf_counter() - t0
        new = [f"logs/dt=2026-11-30/part-{n_keys + i:07d}.parquet" for i in range(10)]
        put_http(client, bucket, new)
        calls["n"] = 0
        t_tick, dec = timed(lambda: poll_s3(platform, src, first.cursor, None), repeat)
        tick_calls = calls["n"] // repeat
        assert [f.key for b in dec.batches for f in b.files] == new, "the tick must find exactly the 10 new keys"
        last_seen = keys[-1]
        calls["n"] = 0
        t_get, objs = timed(lambda: get_objects(bucket, "logs/", since_key=last_seen, client=client), repeat)
        get_calls = calls["n"] // repeat
        assert sorted(o["Key"] for o in objs) == new
    finally:
        client.meta.events.unregister("before-call.s3.ListObjectsV2", count)
    return {"keys": n_keys, "first_tick_full_listing_s": t_full, "tick_s": t_tick, "get_objects_s": t_get,
            "tick_requests": tick_calls, "get_objects_requests": get_calls}


def bench_rerun(platform, client, processed: int, tmp: Path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakehouse.metadata.loader import load_metadata
    from lakehouse.stage.runner import StageRunner

    def body(k: str) -> bytes:
        buf = io.BytesIO()
        pq.write_table(pa.table({"key": [k] * 3, "n": [1, 2, 3],
                                 "extra": [{"workflow_name": "wf" + str(len(k) % 5)}] * 3}), buf)
        return buf.getvalue()

    yaml = tmp / "bench.yaml"
    blocks = ["pipelines:", "  - {pipeline_id: big}", "  - {pipeline_id: small}", "sources:"]
    for name in ("big", "small"):
        blocks.append(f"  - {{source_id: {name}_src, kind: s3, format: parquet, bucket: bench-{name}, prefix: logs/, "
                      f"glob: '*.parquet', batch_files: 2000, max_files_per_run: {max(processed, 10) + 10}, "
                      "download_threads: 16}")
    blocks.append("targets:")
    for name in ("big", "small"):
        blocks.append(f"  - {{target_id: {name}_t, namespace: bench, table: {name}}}")
    blocks.append("stages:")
    for name in ("big", "small"):
        blocks.append(f"  - {{pipeline_id: {name}, stage_order: 1, stage_name: ingest, layer: bronze, "
                      f"source_id: {name}_src, target_id: {name}_t}}")
    yaml.write_text("\n".join(blocks) + "\n")
    platform.store.apply(load_metadata(yaml))

    def run(pipeline: str):
        r = StageRunner(platform, pipeline, "ingest")
        plan = r.extract()
        return plan, r.load(plan)

    client.create_bucket(Bucket="bench-big")
    client.create_bucket(Bucket="bench-small")
    old = [f"logs/2026/11/{i // 1000:03d}/part-{i:06d}.parquet" for i in range(processed)]
    print(f"[B] uploading {processed:,} parquet files ...", flush=True)
    put_many(client, "bench-big", old, body)
    t0 = time.perf_counter()
    plan, out = run("big")
    print(f"[B] initial ingest of {processed:,} files: {time.perf_counter() - t0:.1f}s, {out.rows_written} rows, "
          f"{len(out.writes)} commit(s)", flush=True)
    run("small")  # warm-up of the small pipeline's code paths (no files yet: skipped)

    rerun_times, small_times = [], []
    for rnd in range(3):
        put_many(client, "bench-big", [f"logs/2026/12/r{rnd}/part-{i:03d}.parquet" for i in range(10)], body)
        t0 = time.perf_counter()
        plan, out = run("big")
        rerun_times.append(time.perf_counter() - t0)
        assert plan.details["files_planned"] == 10 and out.rows_written == 30, plan.details
        put_many(client, "bench-small", [f"logs/r{rnd}/part-{i:03d}.parquet" for i in range(10)], body)
        t0 = time.perf_counter()
        plan, out = run("small")
        small_times.append(time.perf_counter() - t0)
        assert plan.details["files_planned"] == 10 and out.rows_written == 30, plan.details
    # the periodic full reconciliation, for reference: lists and looks up every key
    from lakehouse.ingest.s3 import get_cursor, set_cursor

    after, _ = get_cursor(platform, "bench.big", "big_src")
    set_cursor(platform, "bench.big", "big_src", after, 0.0)
    put_many(client, "bench-big", [f"logs/2026/12/rz/part-{i:03d}.parquet" for i in range(10)], body)
    t0 = time.perf_counter()
    plan, out = run("big")
    t_full = time.perf_counter() - t0
    assert plan.details["listing"] == "full" and plan.details["files_planned"] == 10
    return {"processed": processed, "rerun_s": statistics.median(rerun_times),
            "small_s": statistics.median(small_times), "full_reconcile_rerun_s": t_full}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000,
                    help="existing keys for the sensor tick (A); the issue's size is 100000 (slow on moto)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--processed", type=int, default=10_000, help="already processed files for the rerun (B)")
    ap.add_argument("--skip-sensor", action="store_true")
    ap.add_argument("--skip-rerun", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench_arrivals_"))
    url, moto = start_moto()
    os.environ.update({"LAKEHOUSE_HOME": str(tmp), "LAKEHOUSE_S3_ENDPOINT_URL": url,
                       "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    os.environ.setdefault("LAKEHOUSE_SPARK_MASTER", "local[2]")
    os.environ.setdefault("LAKEHOUSE_SHUFFLE_PARTITIONS", "2")
    try:
        from lakehouse.metadata.store import MetadataStore
        from lakehouse.settings import load_settings
        from lakehouse.stage.runner import Platform

        settings = load_settings()
        platform = Platform(settings, MetadataStore(settings.control_db_url))
        client = platform.s3.client(url)  # dagster-aws's S3Resource client, shared with poll_s3
        if not args.skip_sensor:
            a = bench_sensor(platform, client, args.keys, args.repeat)
            print(f"\n[A] sensor tick, {a['keys']:,} existing keys + 10 new")
            print(f"    poll_s3 (StartAfter cursor)          {a['tick_s'] * 1000:9.1f} ms")
            print(f"    dagster_aws get_objects (full list)  {a['get_objects_s'] * 1000:9.1f} ms")
            print(f"    ratio get_objects / poll_s3          {a['get_objects_s'] / a['tick_s']:9.1f}x")
            print(f"    ListObjectsV2 requests per tick      {a['tick_requests']:>9} vs {a['get_objects_requests']}")
            print(f"    (first tick = full reconciliation    {a['first_tick_full_listing_s'] * 1000:9.1f} ms)", flush=True)
        if not args.skip_rerun:
            b = bench_rerun(platform, client, args.processed, tmp)
            print(f"\n[B] run with {b['processed']:,} processed files + 10 new vs a run over just the 10")
            print(f"    rerun (incremental listing)          {b['rerun_s']:9.2f} s")
            print(f"    run over just the 10 new files       {b['small_s']:9.2f} s")
            print(f"    ratio                                {b['rerun_s'] / b['small_s']:9.2f}x (goal <= 1.5x)")
            print(f"    (rerun with full reconciliation      {b['full_reconcile_rerun_s']:9.2f} s)")
    finally:
        moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
