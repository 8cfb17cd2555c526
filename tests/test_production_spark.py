"""Spark pointed at a standalone cluster: a master and a worker started from the PySpark
distribution on 127.0.0.1, and the demo pipeline run on it by `lakehouse run` in a subprocess
(the test session's own SparkSession stays on its local master)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from lakehouse.cli.demo import expected_daily
from tests.fixtures.dagster_dev import REPO, lakehouse_cli, platform_env, stop_process_group
from tests.fixtures.net import free_port

pytestmark = [pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent


def master_state(web_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    """spark://127.0.0.1:<port> with one 1-core worker; stopped (process groups) at the end."""
    root = tmp_path_factory.mktemp("spark_cluster")
    port, web, worker_web = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOCAL_DIRS": str(root / "local"), "SPARK_LOG_DIR": str(root / "logs"),
           "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_MEMORY": "256m"}
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    procs = []
    with (root / "master.log").open("w") as mlog:
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(web)], env=env, stdout=mlog, stderr=subprocess.STDOUT, start_new_session=True))
    with (root / "worker.log").open("w") as wlog:
        procs.append(subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host", "127.0.0.1",
             "--cores", "1", "--memory", "1g", "--webui-port", str(worker_web), "--work-dir", str(root / "work")],
            env=env, stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if any(w["state"] == "ALIVE" for w in master_state(web)["workers"]):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("standalone cluster did not come up:\n"
                                   + (root / "master.log").read_text()[-2000:] + (root / "worker.log").read_text()[-2000:])
            time.sleep(1)
        yield {"master": f"spark://127.0.0.1:{port}", "web_port": web, "work_dir": root / "work"}
    finally:
        for p in reversed(procs):
            stop_process_group(p, grace=15)


def test_demo_pipeline_runs_on_a_standalone_cluster(standalone_cluster, tmp_path):
    home = tmp_path / "home"
    env = platform_env(
        home,
        LAKEHOUSE_SPARK_MASTER=standalone_cluster["master"],
        **{"LAKEHOUSE_SPARK_CONF__spark.executor.memory": "512m",
           "LAKEHOUSE_SPARK_CONF__spark.cores.max": "1",
           "LAKEHOUSE_SPARK_CONF__spark.driver.host": "127.0.0.1",
           "LAKEHOUSE_SPARK_CONF__spark.driver.bindAddress": "127.0.0.1"},
    )
    env.pop("DAGSTER_HOME")  # headless: the instance under LAKEHOUSE_HOME is created by the CLI
    lakehouse_cli(env, "metadata", "apply", str(REPO / "metadata" / "demo"))
    lakehouse_cli(env, "demo", "--rows", "800", "--files", "2", "--seed", "21")
    # exit 0: success with warnings (the demo quarantines its records without an id, as designed)
    out = lakehouse_cli(env, "run", "user_events_etl", timeout=900, ok=(0,)).stdout
    assert "SUCCESS" in out.splitlines()[0], out
    assert any(ln.split()[:2] == ["gold/daily_user_events", "published"] for ln in out.splitlines()), out

    # the driver registered with the master as an application, and executors ran on the worker
    apps = master_state(standalone_cluster["web_port"])
    names = [a["name"] for a in apps["completedapps"] + apps["activeapps"]]
    assert "lakehouse" in names, apps
    app_dirs = list(standalone_cluster["work_dir"].glob("app-*/*/stderr"))
    assert app_dirs, "no executor ran on the worker"

    cat = SqlCatalog("lake", uri=f"sqlite:///{home / 'catalog.db'}", warehouse=f"file://{home / 'warehouse'}")
    gold = cat.load_table("gold.daily_user_events").scan().to_arrow().to_pylist()
    assert {str(r["event_date"]): (r["total_events"], r["unique_users"]) for r in gold} == \
        expected_daily(home / "landing" / "user_events")
