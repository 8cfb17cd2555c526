"""The load API tells clients what they need and nothing more (issue 40 item 4), against the real
server process: `lakehouse serve` (uvicorn) on a free port over an embedded control DB and catalog,
a persistent Dagster instance with the queued run coordinator and no daemon (accepted loads stay
queued: nothing here needs one to run). Tokens are made with the real CLI (`lakehouse serve token`).
Requests that must be refused before their body is read are written on a raw socket: the headers
go out, the body never does, and the answer must come anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from tests.fixtures.dagster_daemon import SLOW_MACHINE_ENV, write_instance_config
from tests.fixtures.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
SHARED = "svc-shared-operator-token-0123456789"
LIMIT = 65_536
META = """
sources:
  - {source_id: redshift_extract, kind: files, format: parquet, path: extract/redshift, glob: "*.parquet",
     options: {connection_qualified_name: "default/redshift/1700000000"}}
applications:
  - {application_id: redshift, source_id: redshift_extract}
  - {application_id: salesforce, source_id: redshift_extract, engine: arrow}
"""


@dataclass
class Server:
    url: str
    home: Path
    landing: Path
    env: dict[str, str]
    process: subprocess.Popen
    log: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).with_name("lakehouse")), *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=300)

    def token(self, *args: str) -> tuple[str, str]:
        out = self.cli("serve", "token", *args)
        assert out.returncode == 0, out.stderr
        found = dict(re.findall(r"^(token_id|token): (\S+)$", out.stdout, re.M))
        return found["token_id"], found["token"]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


def auth(token: str | None, tenant: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token}"} if token else {}
    if tenant is not None:
        h["X-Tenant-Id"] = tenant
    return h


def raw(url: str, head: str, body_chunks: list[bytes] = (), timeout: float = 20.0) -> tuple[int, bytes, float]:
    """Send `head` (request line and headers), then the chunks as far as the server takes them;
    (status, response body, seconds until the whole response was read)."""
    u = urlsplit(url)
    t0 = time.monotonic()
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        s.sendall(head.encode("latin-1"))
        for chunk in body_chunks:
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        while b"\r\n\r\n" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
        header, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?im)^content-length:\s*(\d+)", header).group(1))
        while len(body) < length:
            more = s.recv(65536)
            if not more:
                break
            body += more
    return int(header.split()[1]), body, time.monotonic() - t0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("load_api_security")
    env = {**os.environ, **SLOW_MACHINE_ENV,
           "LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}",
           "LAKEHOUSE_DATAHUB": "off", "LAKEHOUSE_API_TOKEN": SHARED,
           "LAKEHOUSE_API_MAX_BODY_BYTES": str(LIMIT), "DAGSTER_HOME": str(home / "dagster")}
    for k in ("LAKEHOUSE_LANDING_DIR", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_API_DOCS"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    (home / "apps.yaml").write_text(META)
    MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(home / "apps.yaml"))
    write_instance_config(home / "dagster", max_concurrent_runs=1, tag_concurrency_limits=None,
                          default_pool_limit=None, module="lakehouse_assets.definitions", location_name="lakehouse")
    landing = home / "landing" / "extract" / "redshift"
    landing.mkdir(parents=True)
    port = free_port()
    log = home / "serve.log"
    out = log.open("ab")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("lakehouse")), "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--workspace", str(home / "dagster" / "workspace.yaml")],
                            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    srv = Server(f"http://127.0.0.1:{port}", home, landing, env, proc, log)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:  # liveness answers without a token
                if requests.get(f"{srv.url}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lakehouse serve did not come up:\n{srv.tail()}")
            time.sleep(1)
        yield srv
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        out.close()


def _no_server_path(server: Server, text: str) -> None:
    for p in {str(server.home), os.path.realpath(server.home), str(server.landing), "/tmp/", "file:"}:
        assert p not in text, (p, text)


def test_liveness_needs_no_token_and_readiness_details_need_one(server):
    r = requests.get(f"{server.url}/health", timeout=30)
    assert (r.status_code, r.json()) == (200, {"status": "ok"})  # status only
    r = requests.get(f"{server.url}/actuator/health", timeout=30)
    assert (r.status_code, r.json()) == (200, {"status": "UP"})
    assert requests.get(f"{server.url}/health", headers=auth("wrong"), timeout=30).status_code == 401
    r = requests.get(f"{server.url}/health", headers=auth(SHARED), timeout=30)
    # no daemon here: readiness says so, in detail, to a token holder
    assert set(r.json()["checks"]) == {"control_db", "catalog", "dagster"}
    assert r.json()["checks"]["control_db"]["ok"] and r.json()["checks"]["catalog"]["ok"]
    assert r.status_code == 503 and not r.json()["checks"]["dagster"]["ok"]


def test_docs_and_openapi_are_behind_the_token(server):
    for path in ("/docs", "/openapi.json", "/redoc"):
        r = requests.get(f"{server.url}{path}", timeout=30)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", path
        assert requests.get(f"{server.url}{path}", headers=auth("nope"), timeout=30).status_code == 401
        assert requests.get(f"{server.url}{path}", headers=auth(SHARED), timeout=30).status_code == 200, path
    assert "/load" in requests.get(f"{server.url}/openapi.json", headers=auth(SHARED), timeout=30).json()["paths"]


def test_unauthenticated_bodies_are_refused_before_they_are_read(server):
    # malformed JSON without a token: 401, not 422 (the body is never parsed)
    for headers in ({}, auth("wrong-token"), {"Authorization": "Basic dXNlcjpwYXNz"}):
        r = requests.post(f"{server.url}/load", data=b"{not json", timeout=30,
                          headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 401, (headers, r.text)
    # 200 MB announced, not one byte of it sent: the answer comes from the headers alone
    huge = 200 * 1024 * 1024
    for token in (None, "wrong-token"):
        head = (f"POST /load HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {huge}\r\n"
                + (f"Authorization: Bearer {token}\r\n" if token else "") + "\r\n")
        status, body, took = raw(server.url, head)
        print(f"200 MB announced, token {'wrong' if token else 'missing'}: 401 after {took * 1000:.1f} ms")
        assert status == 401 and took < 10, (status, took)
        assert json.loads(body) == {"detail": "missing or invalid bearer token"}
    # the same without a declared length (chunked), some of it sent: 401 too
    head = "POST /load HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, _, _ = raw(server.url, head, [b"4000\r\n" + b"x" * 0x4000 + b"\r\n"] * 4)
    assert status == 401


def test_bodies_over_the_limit_get_413_without_an_echo(server):
    huge = 200 * 1024 * 1024
    head = (f"POST /load HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {huge}\r\n"
            f"Authorization: Bearer {SHARED}\r\n\r\n")
    status, body, took = raw(server.url, head)
    assert status == 413 and took < 10 and len(body) < 300, (status, took, body)
    assert str(LIMIT) in json.loads(body)["detail"]
    # no declared length: read only up to the limit, then 413
    head = (f"POST /load HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            f"Authorization: Bearer {SHARED}\r\n\r\n")
    chunk = b"4000\r\n" + b"y" * 0x4000 + b"\r\n"
    status, body, _ = raw(server.url, head, [chunk] * 8)
    assert status == 413 and b"yyyy" not in body and len(body) < 300
    # just over the limit through an ordinary client
    big = json.dumps({"application": "redshift", "tenant_id": "acme", "file_keys": ["k" * (LIMIT + 10)]})
    r = requests.post(f"{server.url}/load", data=big, headers={**auth(SHARED), "Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 413 and len(r.content) < 300
    # under the limit but invalid: 422 naming the field, never echoing the value
    bad = {"application": "redshift", "tenant_id": "acme", "file_keys": "z" * (LIMIT - 200), "bogus": "b" * 100}
    r = requests.post(f"{server.url}/load", json=bad, headers=auth(SHARED), timeout=30)
    assert r.status_code == 422 and len(r.content) < 2000, len(r.content)
    assert {("body", "file_keys"), ("body", "bogus")} <= {tuple(e["loc"]) for e in r.json()["detail"]}
    assert "zzzz" not in r.text and "bbbb" not in r.text
    r = requests.post(f"{server.url}/load", data=b"{not json", timeout=30,
                      headers={**auth(SHARED), "Content-Type": "application/json"})
    assert r.status_code == 422  # with a token, malformed JSON is the client's 422


def test_no_server_path_in_any_error_of_a_traversal_corpus(server):
    outside = server.home / "outside"
    outside.mkdir()
    (outside / "secret.parquet").write_bytes(b"PAR1 not yours PAR1")
    (server.landing / "wf" / "r1" / "raw" / "t").mkdir(parents=True)
    (server.landing / "wf" / "r1" / "raw" / "t" / "link.parquet").symlink_to(outside / "secret.parquet")
    (server.landing / "wf" / "escape").symlink_to(outside, target_is_directory=True)
    (server.landing / "rootlink.parquet").symlink_to("/etc/hostname")
    refused_keys = ["../x.parquet", "../../../../etc/passwd", "/etc/passwd", str(outside / "secret.parquet"),
                    f"file://{outside}/secret.parquet", "wf/../../outside/secret.parquet", "..\\..\\etc\\passwd",
                    "%2e%2e/%2e%2e/etc/passwd", "..%2F..%2Fetc%2Fpasswd", "%252e%252e%252fetc", "~/x.parquet",
                    "C:\\Windows\\win.ini", "wf/a\x00b.parquet", "wf/r1/raw/t/link.parquet",
                    "wf/escape/secret.parquet", "rootlink.parquet", "wf/./../x"]
    for key in refused_keys:
        r = requests.post(f"{server.url}/load", json={"application": "redshift", "tenant_id": "acme",
                                                      "file_keys": [key]}, headers=auth(SHARED), timeout=30)
        assert r.status_code == 400, (key, r.status_code, r.text)
        detail = r.json()["detail"]
        assert repr(key) in detail, (key, detail)  # names the key the client sent ...
        _no_server_path(server, detail.replace(repr(key), "<key>"))  # ... and nothing of the server
    for pattern in ("../*", "/etc/*", "%2e%2e/*", "wf/../../*"):
        r = requests.post(f"{server.url}/load", json={"application": "redshift", "tenant_id": "acme",
                                                      "patterns": [pattern]}, headers=auth(SHARED), timeout=30)
        assert r.status_code == 400 and repr(pattern) in r.json()["detail"], (pattern, r.text)
    # job ids shaped as paths: 404 naming the id, nothing else
    for job in ("..%2F..%2Fetc%2Fpasswd", "%2e%2e", "x" * 100, "..;/etc"):
        r = requests.get(f"{server.url}/load/{job}", headers=auth(SHARED, "acme"), timeout=30)
        assert r.status_code in (404, 405), (job, r.status_code)
        _no_server_path(server, r.text)
    # a key inside the landing location is accepted (the run reports a missing file by its key)
    r = requests.post(f"{server.url}/load", json={"application": "redshift", "tenant_id": "acme",
                                                  "file_keys": ["wf/r2/raw/t/later.parquet", "odd%name.parquet"]},
                      headers=auth(SHARED), timeout=30)
    assert r.status_code == 202, r.text
    assert requests.get(f"{server.url}/load/{r.json()['job_id']}", headers=auth(SHARED, "acme"),
                        timeout=30).json()["status"] == "queued"


def test_a_tenant_token_acts_for_its_tenant_and_applications_only(server):
    a_id, token_a = server.token("add", "--tenant", "acme", "--applications", "redshift")
    _b_id, token_b = server.token("add", "--tenant", "globex", "--applications", "redshift,salesforce")
    body = {"application": "redshift", "tenant_id": "acme", "file_keys": ["wf/r3/raw/t/a.parquet"]}

    # only a hash is stored: the secret is nowhere in the control DB
    secret = token_a.split("_", 2)[2]
    with sqlite3.connect(server.home / "control.db") as db:
        rows = db.execute("SELECT token_id, tenant_id, applications, token_hash FROM api_tokens").fetchall()
    assert (a_id, "acme", '["redshift"]', hashlib.sha256(secret.encode()).hexdigest()) in rows
    assert secret.encode() not in (server.home / "control.db").read_bytes()

    r = requests.post(f"{server.url}/load", json=body, headers=auth(token_a), timeout=30)
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    # A's token cannot act for B, whatever the header or the body say
    r = requests.post(f"{server.url}/load", json={**body, "tenant_id": "globex"}, headers=auth(token_a), timeout=30)
    assert r.status_code == 403 and "tenant 'globex'" in r.json()["detail"]
    r = requests.post(f"{server.url}/load", json={**body, "tenant_id": "globex"}, headers=auth(token_a, "globex"),
                      timeout=30)
    assert r.status_code == 403
    # nor for an application outside its set (and it is not told which others exist)
    r = requests.post(f"{server.url}/load", json={**body, "application": "salesforce"}, headers=auth(token_a),
                      timeout=30)
    assert r.status_code == 403 and "salesforce" in r.text and "redshift" not in r.text
    # its own job: found without a header (the token names the tenant); B and a foreign header see nothing
    r = requests.get(f"{server.url}/load/{job}", headers=auth(token_a), timeout=30)
    assert r.status_code == 200 and r.json()["tenant_id"] == "acme"
    assert requests.get(f"{server.url}/load/{job}", headers=auth(token_b), timeout=30).status_code == 404
    assert requests.get(f"{server.url}/load/{job}", headers=auth(token_b, "acme"), timeout=30).status_code == 404
    assert requests.get(f"{server.url}/load/{job}", headers=auth(token_a, "globex"), timeout=30).status_code == 404
    # B for its own tenant works; a forged token of A's id with B's secret does not
    r = requests.post(f"{server.url}/load", json={**body, "tenant_id": "globex", "application": "salesforce"},
                      headers=auth(token_b), timeout=30)
    assert r.status_code == 202, r.text
    forged = f"lht_{a_id}_{token_b.split('_', 2)[2]}"
    assert requests.post(f"{server.url}/load", json=body, headers=auth(forged), timeout=30).status_code == 401


def test_rotation_keeps_two_tokens_valid_until_the_old_one_is_revoked(server):
    old_id, old = server.token("add", "--tenant", "initech", "--applications", "*")
    new_id, new = server.token("rotate", old_id)
    assert new_id != old_id and new != old
    body = {"application": "salesforce", "tenant_id": "initech", "file_keys": ["wf/r4/raw/t/a.parquet"]}
    for token in (old, new):  # both valid during the rotation
        r = requests.post(f"{server.url}/load", json=body, headers=auth(token), timeout=30)
        assert r.status_code == 202, r.text
    listed = server.cli("serve", "token", "list", "--tenant", "initech").stdout
    assert f"{new_id}  tenant=initech  applications=*  valid  replaces={old_id}" in listed
    assert old not in listed and new not in listed  # secrets are never listed
    assert server.cli("serve", "token", "revoke", old_id).returncode == 0
    assert requests.post(f"{server.url}/load", json=body, headers=auth(old), timeout=30).status_code == 401
    assert requests.post(f"{server.url}/load", json=body, headers=auth(new), timeout=30).status_code == 202
    assert server.cli("serve", "token", "revoke", old_id).returncode == 2  # already revoked
    assert "revoked" in server.cli("serve", "token", "list", "--tenant", "initech").stdout
