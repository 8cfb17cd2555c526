"""Seed 000's wire format and client against the real server (issue 43 item 1): `lakehouse serve`
on a free port, a persistent Dagster instance with `dagster-daemon run` dequeuing the loads, the
`salesforce` application on the Arrow engine (PyIceberg writes; no JVM). The seed's own client loop
is written here from the seed's description (health, submit, poll until COMPLETED with a fresh
session and a 30 s timeout per request, fail fast on 4xx); the platform's client
(`submit_and_poll`, `lakehouse load submit --wait`) runs against the same server. Rows are counted
with PyIceberg, an independent reader. The one addition to the seed's requests is the bearer token:
the platform's load API never runs open.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.service.client import LoadFailed, submit_and_poll
from lakehouse.settings import PlatformSettings
from tests.fixtures.dagster_daemon import SLOW_MACHINE_ENV, DagsterDaemon, write_instance_config
from tests.fixtures.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parent.parent
META = """
sources:
  - {source_id: sf_extract, kind: files, format: parquet, path: extract/sf, glob: "*.parquet",
     options: {connection_qualified_name: "default/salesforce/1700000000"}}
applications:
  - {application_id: salesforce, source_id: sf_extract, engine: arrow}
"""


class Seed:
    def __init__(self, url: str, home: Path, env: dict[str, str], token: str, other_token: str):
        self.url, self.home, self.env, self.token, self.other_token = url, home, env, token, other_token
        self.landing = home / "landing" / "extract" / "sf"
        self.catalog = SqlCatalog("lake", uri=f"sqlite:///{home / 'catalog.db'}", warehouse=f"file://{home / 'warehouse'}")

    def land(self, run: str, rows: int, typename: str = "table") -> str:
        key = f"wf/{run}/raw/{typename}/chunk-0.parquet"
        (self.landing / key).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([{"name": f"{run}_{i}", "pos": i} for i in range(rows)]),
                       self.landing / key)
        return key

    def rows(self, run: str) -> list[str]:
        table = self.catalog.load_table("entity_raw.salesforce")
        return sorted(json.loads(r["raw_record"])["name"] for r in table.scan().to_arrow().to_pylist()
                      if r["workflow_run_id"] == run)


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    home = tmp_path_factory.mktemp("load_api_seed")
    env = {**os.environ, **SLOW_MACHINE_ENV,
           "LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}",
           "LAKEHOUSE_DATAHUB": "off", "DAGSTER_HOME": str(home / "dagster")}
    for k in ("LAKEHOUSE_LANDING_DIR", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_API_TOKEN",
              "LAKEHOUSE_CATALOG_NAME"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    (home / "apps.yaml").write_text(META)
    MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(home / "apps.yaml"))
    lakehouse = str(Path(sys.executable).with_name("lakehouse"))
    tokens = []
    for tenant in ("acme", "globex"):  # per-tenant tokens only: no shared token at all
        out = subprocess.run([lakehouse, "serve", "token", "add", "--tenant", tenant, "--applications", "salesforce"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=True).stdout
        tokens.append(re.search(r"^token: (\S+)$", out, re.M).group(1))
    dagster_home = home / "dagster"
    write_instance_config(dagster_home, max_concurrent_runs=2, tag_concurrency_limits=None, default_pool_limit=None,
                          module="lakehouse_assets.definitions", location_name="lakehouse")
    daemon = DagsterDaemon(home=dagster_home, env=env)
    daemon.instance.get_runs(limit=1)
    port = free_port()
    log = home / "serve.log"
    out = log.open("ab")
    proc = None
    try:
        daemon.start()
        proc = subprocess.Popen([lakehouse, "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--workspace", str(dagster_home / "workspace.yaml")],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        s = Seed(f"http://127.0.0.1:{port}", home, env, tokens[0], tokens[1])
        deadline = time.monotonic() + 600
        while True:
            try:
                if requests.get(f"{s.url}/health", headers={"Authorization": f"Bearer {s.token}"},
                                timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("lakehouse serve did not become ready:\n"
                                   + log.read_text(errors="replace")[-4000:] + daemon.log_tail())
            time.sleep(1)
        yield s
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        out.close()
        daemon.stop()


def seed_client_load(base: str, tenant: str, token: str, table: str, patterns: list[str], file_keys: list[str],
                     poll_interval: float = 2.0, max_attempts: int = 360) -> dict:
    """Seed 000's connector loop, from its description: health check, POST /load (camelCase,
    `fileKeys` always sent), 202 + jobId, poll GET /load/{jobId}/status with a fresh session per
    poll and a 30 s timeout, fail fast on a 4xx poll answer, until COMPLETED or FAILED."""
    headers = {"X-Atlan-Tenant-Id": tenant, "X-Lakehouse-Job-Id": f"wf-{table}-corr",
               "Authorization": f"Bearer {token}"}
    with requests.Session() as s:
        health = s.get(f"{base}/actuator/health", timeout=30)
        assert health.status_code == 200 and health.json() == {"status": "UP"}
        r = s.post(f"{base}/load", json={"namespace": "entity_raw", "tableName": table, "mode": "APPEND",
                                         "fileKeys": file_keys, "patterns": patterns}, headers=headers, timeout=30)
    assert r.status_code == 202, r.text
    assert r.headers["X-Lakehouse-Job-Id"] == "wf-salesforce-corr"
    job_id = r.json()["jobId"]
    for _ in range(max_attempts):
        with requests.Session() as s:
            p = s.get(f"{base}/load/{job_id}/status", headers=headers, timeout=30)
        if 400 <= p.status_code < 500:
            raise AssertionError(f"non-retryable poll answer {p.status_code}: {p.text}")
        if p.status_code == 200 and p.json()["status"] in ("COMPLETED", "FAILED"):
            assert p.headers["X-Lakehouse-Job-Id"] == "wf-salesforce-corr"
            return p.json()
        time.sleep(poll_interval)
    raise AssertionError("the load did not finish")


def test_the_seeds_client_loop_loads_rows_an_independent_reader_counts(seed):
    key = seed.land("s1", 3)
    seed.land("s1b", 2)
    # patterns only, fileKeys [] (the seed always sends the field)
    done = seed_client_load(seed.url, "acme", seed.token, "salesforce", ["wf/s1b/raw/*/*.parquet"], [])
    assert done["status"] == "COMPLETED", done
    assert (done["filesLoaded"], done["rowsWritten"], done["tenantId"], done["tableName"]) == (1, 2, "acme",
                                                                                              "salesforce")
    assert seed.rows("s1b") == ["s1b_0", "s1b_1"]
    # fileKeys and patterns together
    done = seed_client_load(seed.url, "acme", seed.token, "salesforce", ["wf/none/raw/*/*.parquet"], [key])
    assert done["status"] == "COMPLETED" and done["rowsWritten"] == 3
    assert seed.rows("s1") == ["s1_0", "s1_1", "s1_2"]
    correlation = (seed.home / "serve.log").read_text(errors="replace")
    assert "X-Lakehouse-Job-Id wf-salesforce-corr" in correlation  # logged with the job


def test_the_platforms_client_against_the_same_server(seed):
    key = seed.land("p1", 4)
    seed.land("p2", 1, typename="column")
    settings = PlatformSettings(home=seed.home, mdlh_base_url=seed.url, lh_load_token=seed.token,
                                lh_load_tenant_id="acme", lh_load_raw_table_name="salesforce",
                                lh_load_poll_interval_seconds=2, enable_lakehouse_load=True)
    done = submit_and_poll(file_keys=[key], settings=settings)
    assert done["status"] == "COMPLETED" and done["rowsWritten"] == 4
    assert seed.rows("p1") == [f"p1_{i}" for i in range(4)]
    off = settings.model_copy(update={"enable_lakehouse_load": False})
    assert submit_and_poll(file_keys=[key], settings=off) is None  # ENABLE_LAKEHOUSE_LOAD off: no request

    env = {**seed.env, "MDLH_BASE_URL": seed.url, "LH_LOAD_TOKEN": seed.token, "LH_LOAD_TENANT_ID": "acme",
           "LH_LOAD_POLL_INTERVAL_SECONDS": "2"}
    out = subprocess.run([str(Path(sys.executable).with_name("lakehouse")), "load", "submit", "--application",
                          "salesforce", "--pattern", "wf/p2/raw/*/*.parquet", "--wait"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "COMPLETED"
    assert seed.rows("p2") == ["p2_0"]


def test_a_missing_or_foreign_tenant_header_is_refused_and_a_4xx_poll_fails_fast(seed):
    key = seed.land("t1", 1)
    body = {"tableName": "salesforce", "fileKeys": [key], "patterns": []}
    auth = {"Authorization": f"Bearer {seed.token}"}
    r = requests.post(f"{seed.url}/load", json=body, headers=auth, timeout=30)
    assert r.status_code == 400 and "X-Atlan-Tenant-Id" in r.text  # required on the seed's routes
    r = requests.post(f"{seed.url}/load", json=body, headers={**auth, "X-Atlan-Tenant-Id": "globex"}, timeout=30)
    assert r.status_code == 403  # acme's token cannot act for globex
    r = requests.post(f"{seed.url}/load", json={**body, "fileKeys": "x"},
                      headers={**auth, "X-Atlan-Tenant-Id": "acme"}, timeout=30)
    assert r.status_code == 422 and ["body", "fileKeys"] in [e["loc"] for e in r.json()["detail"]]
    r = requests.post(f"{seed.url}/load", json={**body, "namespace": "entity_metadata"},
                      headers={**auth, "X-Atlan-Tenant-Id": "acme"}, timeout=30)
    assert r.status_code == 400 and "entity_raw" in r.text
    r = requests.post(f"{seed.url}/load", json=body, headers={**auth, "X-Atlan-Tenant-Id": "acme"}, timeout=30)
    assert r.status_code == 202
    job = r.json()["jobId"]
    assert requests.get(f"{seed.url}/load/{job}/status", headers=auth, timeout=30).status_code == 400
    other = {"Authorization": f"Bearer {seed.other_token}", "X-Atlan-Tenant-Id": "globex"}
    assert requests.get(f"{seed.url}/load/{job}/status", headers=other, timeout=30).status_code == 404
    assert requests.get(f"{seed.url}/load/{job}/status", headers={**auth, "X-Atlan-Tenant-Id": "globex"},
                        timeout=30).status_code == 404

    # the platform's client: a poll answered 4xx (here: the tenant's token revoked mid-load) fails at once
    out = subprocess.run([str(Path(sys.executable).with_name("lakehouse")), "serve", "token", "add", "--tenant",
                          "acme", "--applications", "salesforce"], env=seed.env, cwd=REPO, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    token_id, token = re.search(r"^token_id: (\S+)$", out, re.M).group(1), re.search(r"^token: (\S+)$", out, re.M).group(1)
    polls: list[float] = []

    def revoke_then_sleep(seconds: float) -> None:
        if not polls:
            subprocess.run([str(Path(sys.executable).with_name("lakehouse")), "serve", "token", "revoke", token_id],
                           env=seed.env, cwd=REPO, check=True, capture_output=True, timeout=300)
        polls.append(seconds)

    settings = PlatformSettings(home=seed.home, mdlh_base_url=seed.url, lh_load_token=token, lh_load_tenant_id="acme",
                                lh_load_poll_interval_seconds=1, enable_lakehouse_load=True)
    with pytest.raises(LoadFailed, match="HTTP 401"):
        submit_and_poll(application="salesforce", file_keys=[seed.land("t2", 1)], settings=settings,
                        sleep=revoke_then_sleep)
    assert len(polls) == 1  # not 360 attempts
