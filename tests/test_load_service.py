"""The entity_raw load service (seed 000) over HTTP, against the real server process: `lakehouse
serve` (uvicorn) on a free port, a persistent Dagster instance with the queued run coordinator and
`dagster-daemon run` dequeuing the load runs (two at a time), the Iceberg catalog on PostgreSQL as in
production. Results are read back with PyIceberg, an independent reader. The `redshift` application's
loads write through Spark (a run worker with its own JVM per load); the 20 concurrent loads go to
`salesforce`, whose `engine: arrow` writes with PyIceberg (seed 000's common case, a few records per
workflow run; no JVM, so 20 run workers fit the 2 cores), through the same write-audit-publish
service and its exactly-once publish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from tests.fixtures.dagster_daemon import SLOW_MACHINE_ENV, DagsterDaemon, write_instance_config
from tests.fixtures.net import free_port

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parent.parent
TOKEN = "svc-test-token-0123456789"
META = """
sources:
  - {source_id: redshift_extract, kind: files, format: parquet, path: extract/redshift, glob: "*.parquet",
     options: {connection_qualified_name: "default/redshift/1700000000"}}
applications:
  - {application_id: redshift, source_id: redshift_extract}
  - {application_id: snowflake, source_id: redshift_extract}
  - {application_id: salesforce, source_id: redshift_extract, engine: arrow}
  - {application_id: retired, enabled: false}
"""


@dataclass
class Service:
    url: str
    landing: Path
    catalog: SqlCatalog
    process: subprocess.Popen
    log: Path

    def headers(self, tenant: str | None = "acme", token: str | None = TOKEN) -> dict[str, str]:
        h = {}
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        if tenant is not None:
            h["X-Tenant-Id"] = tenant
        return h

    def post(self, body: dict, **kw) -> requests.Response:
        return requests.post(f"{self.url}/load", json=body, headers=self.headers(**kw), timeout=60)

    def get(self, job_id: str, **kw) -> requests.Response:
        return requests.get(f"{self.url}/load/{job_id}", headers=self.headers(**kw), timeout=60)

    def wait(self, job_ids: list[str], timeout: float = 1800) -> dict[str, dict]:
        deadline = time.monotonic() + timeout
        done: dict[str, dict] = {}
        while len(done) < len(job_ids):
            for j in job_ids:
                if j not in done:
                    body = self.get(j).json()
                    if body["status"] in ("success", "failed"):
                        done[j] = body
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(job_ids) - len(done)} load(s) unfinished after {timeout}s\n" + self.tail())
            time.sleep(2)
        return done

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""

    def land(self, workflow_run: str, rows: int) -> str:
        key = f"wf/{workflow_run}/raw/table/chunk-0.parquet"
        path = self.landing / key
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([{"table_name": f"{workflow_run}_t{i}", "pos": i} for i in range(rows)]),
                       path)
        return key



@pytest.fixture(scope="module")
def service(tmp_path_factory, lake_home, postgres_server):
    home = tmp_path_factory.mktemp("load_service")
    pg = postgres_server
    catalog_db = pg.create_database()  # the multi-user catalog, as in production (loads commit side by side)
    env = {**os.environ, **SLOW_MACHINE_ENV,
           "LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}",
           "LAKEHOUSE_CATALOG_NAME": "lake_svc", "LAKEHOUSE_CATALOG_URI": f"postgresql://{pg.host}:{pg.port}/{catalog_db}",
           "LAKEHOUSE_CATALOG_USER": pg.user, "LAKEHOUSE_CATALOG_PASSWORD": pg.password,
           "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
           "LAKEHOUSE_DATAHUB": "off", "LAKEHOUSE_SPARK_MASTER": "local[1]", "LAKEHOUSE_SHUFFLE_PARTITIONS": "1",
           "LAKEHOUSE_API_TOKEN": TOKEN, "DAGSTER_HOME": str(home / "dagster")}
    env.pop("LAKEHOUSE_LANDING_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    meta = home / "apps.yaml"
    meta.write_text(META)
    MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(meta))
    dagster_home = home / "dagster"
    write_instance_config(dagster_home, max_concurrent_runs=2, tag_concurrency_limits=None, default_pool_limit=None,
                          module="lakehouse_assets.definitions", location_name="lakehouse")
    daemon = DagsterDaemon(home=dagster_home, env=env)
    daemon.instance.get_runs(limit=1)  # create the instance storage before the processes race for it
    port = free_port()
    log = home / "serve.log"
    out = log.open("ab")
    proc = None
    try:
        daemon.start()
        proc = subprocess.Popen([str(Path(sys.executable).with_name("lakehouse")), "serve", "--host", "127.0.0.1",
                                 "--port", str(port), "--workspace", str(dagster_home / "workspace.yaml")],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        svc = Service(f"http://127.0.0.1:{port}", home / "landing" / "extract" / "redshift",
                      SqlCatalog("lake_svc", uri=pg.sqlalchemy_url(catalog_db), warehouse=env["LAKEHOUSE_WAREHOUSE"]),
                      proc, log)
        deadline = time.monotonic() + 600
        while True:
            try:
                if requests.get(f"{svc.url}/health", headers=svc.headers(), timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lakehouse serve did not become healthy:\n{svc.tail()}\n{daemon.log_tail()}")
            time.sleep(1)
        yield svc
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        out.close()
        daemon.stop()


def test_auth_validation_and_health(service):
    ok = {"application": "redshift", "tenant_id": "acme", "file_keys": ["x.parquet"]}
    for kw in ({"token": None}, {"token": "wrong-token"}):
        r = service.post(ok, **kw)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    # liveness answers without a token, with its status only; the details need one
    assert requests.get(f"{service.url}/health", timeout=30).json() == {"status": "ok"}
    assert requests.get(f"{service.url}/health", headers=service.headers(token="wrong"), timeout=30).status_code == 401

    r = service.post({"application": "redshift", "tenant_id": "acme", "file_keys": "x.parquet", "bogus": 1})
    assert r.status_code == 422
    named = {tuple(e["loc"]) for e in r.json()["detail"]}
    assert ("body", "file_keys") in named and ("body", "bogus") in named
    r = service.post({"application": "redshift", "file_keys": ["x.parquet"]})
    assert r.status_code == 422 and ("body", "tenant_id") in {tuple(e["loc"]) for e in r.json()["detail"]}
    r = service.post({"application": "redshift", "tenant_id": "acme"})
    assert r.status_code == 422 and "at least one of file_keys or patterns" in r.text
    r = service.post({**ok, "mode": "MERGE"})
    assert r.status_code == 422 and ("body", "mode") in {tuple(e["loc"]) for e in r.json()["detail"]}

    r = service.post({**ok, "application": "mysql"})
    assert r.status_code == 400
    assert r.json()["detail"]["valid_applications"] == ["redshift", "salesforce", "snowflake"]  # not the disabled one
    assert "valid applications: redshift, salesforce, snowflake" in r.json()["detail"]["error"]
    assert service.post({**ok, "application": "retired"}).status_code == 400
    assert service.post(ok, tenant="globex").status_code == 403  # header and body name different tenants

    h = requests.get(f"{service.url}/health", headers=service.headers(), timeout=30)
    assert h.status_code == 200
    assert {k: v["ok"] for k, v in h.json()["checks"].items()} == {"control_db": True, "catalog": True,
                                                                    "dagster": True}


def test_load_completes_counts_match_an_independent_reader_and_tenants_are_isolated(service):
    key = service.land("r1", 4)
    service.land("r1b", 2)
    r = service.post({"application": "REDSHIFT", "tenant_id": "acme", "workflow_id": "wf", "mode": "append",
                      "workflow_run_id": "r1", "connection_qualified_name": "default/redshift/1700000000",
                      "file_keys": [key], "patterns": ["wf/r1b/raw/*/*.parquet"]})
    assert r.status_code == 202, r.text
    job = r.json()["job_id"]
    assert r.json()["status"] == "queued" and r.json()["table"] == "entity_raw.redshift"
    first = service.get(job).json()
    assert first["status"] in ("queued", "running", "success")
    bad = service.post({"application": "redshift", "tenant_id": "acme", "file_keys": ["wf/none/raw/table/x.parquet"]})
    assert bad.status_code == 202
    done = service.wait([job, bad.json()["job_id"]])
    res = done[job]
    assert res["status"] == "success", (res, service.tail())
    assert (res["files_loaded"], res["rows_written"], res["files_already_loaded"]) == (2, 6, 0)
    assert res["error"] is None and res["dagster_status"] == "SUCCESS"
    assert res["engine"] == "spark" and res["engine_reason"] == "built-in default is spark"
    failed = done[bad.json()["job_id"]]
    assert failed["status"] == "failed" and "wf/none/raw/table/x.parquet" in failed["error"]
    assert "not found" in failed["error"]
    for server_path in (str(service.landing), os.path.realpath(service.landing), "file:"):  # a client reads keys
        assert server_path not in failed["error"], failed["error"]

    table = service.catalog.load_table("entity_raw.redshift")
    rows = [r for r in table.scan().to_arrow().to_pylist() if r["workflow_run_id"] in ("r1", "r1b")]
    assert len(rows) == res["rows_written"]
    assert {(r["tenant_id"], r["workflow_id"], r["typename"]) for r in rows} == {("acme", "wf", "table")}
    assert sorted(json.loads(r["raw_record"])["table_name"] for r in rows) == sorted(
        [f"r1_t{i}" for i in range(4)] + [f"r1b_t{i}" for i in range(2)])

    # another tenant's job does not exist for that tenant; the tenant header is required
    assert service.get(job, tenant="globex").status_code == 404
    r = service.get(job, tenant=None)
    assert r.status_code == 422 and ("header", "X-Tenant-Id") in {tuple(e["loc"]) for e in r.json()["detail"]}
    assert service.get("0" * 32).status_code == 404


def test_twenty_concurrent_loads_all_complete_each_row_once(service):
    runs = [f"c{i:02d}" for i in range(20)]
    keys = {run: service.land(run, 3) for run in runs}
    t0 = time.monotonic()

    def post(run):
        return service.post({"application": "salesforce", "tenant_id": "acme", "workflow_id": "wf",
                             "workflow_run_id": run, "file_keys": [keys[run]]})

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(post, runs))
    assert [a.status_code for a in answers] == [202] * 20, [a.text for a in answers if a.status_code != 202]
    jobs = [a.json()["job_id"] for a in answers]
    assert len(set(jobs)) == 20
    done = service.wait(jobs)
    print(f"20 concurrent loads finished in {time.monotonic() - t0:.0f}s")
    assert {j: d["status"] for j, d in done.items()} == {j: "success" for j in jobs}, service.tail()
    assert all(d["rows_written"] == 3 and d["files_loaded"] == 1 for d in done.values())
    assert {(d["engine"], d["engine_reason"]) for d in done.values()} == {("arrow", "application salesforce engine is arrow")}

    rows = [r for r in service.catalog.load_table("entity_raw.salesforce").scan().to_arrow().to_pylist()
            if r["workflow_run_id"] in runs]
    per_run: dict[str, list[str]] = {}
    for r in rows:
        per_run.setdefault(r["workflow_run_id"], []).append(json.loads(r["raw_record"])["table_name"])
    assert {run: sorted(names) for run, names in per_run.items()} == {
        run: [f"{run}_t{i}" for i in range(3)] for run in runs}  # every row of every load, once
