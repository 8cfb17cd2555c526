"""Transient S3 errors healed inside the step, through a fault-injecting HTTP proxy in front of the
real moto_server: the proxy answers the first N requests with `503 SlowDown` (more than boto3's own
retries absorb), then forwards everything. The run must end healed with every object loaded once."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.control import faults
from lakehouse.metadata.loader import load_metadata
from lakehouse_assets.definitions import build_definitions, pipeline_job

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class FaultProxy:
    """HTTP proxy to `upstream` that fails the first `fail_first` requests with 503 SlowDown."""

    def __init__(self, upstream: str, fail_first: int):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.fail_first = fail_first
        self.seen = 0
        self.failed = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    proxy.seen += 1
                    fail = proxy.seen <= proxy.fail_first
                    if fail:
                        proxy.failed += 1
                if fail:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(SLOW_DOWN)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


PIPELINE = """
pipelines:
  - {{pipeline_id: ts3}}
sources:
  - {{source_id: ts3_raw, kind: s3, format: jsonl, bucket: {bucket}, prefix: in/, glob: "*.jsonl", batch_files: 5}}
targets:
  - {{target_id: ts3_bronze, namespace: bronze, table: ts3}}
stages:
  - {{pipeline_id: ts3, stage_order: 1, stage_name: ingest, layer: bronze, source_id: ts3_raw, target_id: ts3_bronze}}
healing_actions:
  - {{healing_id: s3_throttled, error_code: TRANSIENT_IO, actions: [retry_after_backoff], backoff_seconds: 0.5,
     max_attempts: 4}}
"""


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)


def test_transient_s3_errors_are_healed_by_backoff(platform, s3_server, tmp_path, monkeypatch):
    bucket = s3_server.new_bucket("heal")
    client = s3_server.client()
    for f in range(3):
        client.put_object(Bucket=bucket, Key=f"in/f{f}.jsonl",
                          Body="".join(json.dumps({"id": f * 10 + i}) + "\n" for i in range(4)).encode())
    meta = tmp_path / "ts3.yaml"
    meta.write_text(PIPELINE.format(bucket=bucket))
    platform.store.apply(load_metadata(meta))

    # boto3 here makes 5 attempts per call: 6 straight 503s exhaust it once, so the step itself fails
    with FaultProxy(s3_server.endpoint_url, fail_first=6) as proxy:
        monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", proxy.url)
        job = pipeline_job(build_definitions(platform), "ts3")
        result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
        assert proxy.failed == 6 and proxy.seen > 6
    assert result.success

    cat = SqlCatalog(platform.settings.catalog_name, uri=platform.settings.catalog_uri,
                     warehouse=platform.settings.warehouse)
    ids = cat.load_table("bronze.ts3").scan().to_arrow().column("id").to_pylist()
    assert sorted(ids) == [f * 10 + i for f in range(3) for i in range(4)]

    store = platform.store
    [failed] = store.audit_entries(run_id=result.run_id, event="step_failed")
    assert failed.details["code"] == "TRANSIENT_IO" and "SlowDown" in failed.message
    [act] = store.audit_entries(run_id=result.run_id, event="healing_action")
    assert (act.action, act.outcome) == ("retry_after_backoff", "applied")
    [healed] = store.audit_entries(run_id=result.run_id, event="healing")
    assert healed.outcome == "healed" and healed.details["step"] == "extract"
    mats = {e.asset_key.to_user_string(): e for e in result.get_asset_materialization_events()}
    md = {k: v.value for k, v in mats["bronze/ts3"].materialization.metadata.items()}
    assert md["extract_healing_attempts"] == 1
