"""End to end, runs launched as the UI, the daemon and `lakehouse serve` launch them (the code server
starts the run worker, Dagster's own spawn start) load their rows and log to the run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from lakehouse.runtime import procstat

REPO = Path(__file__).resolve().parent.parent


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for child, st in procstat.snapshot().items():
        argv = procstat.cmdline(child) if st.ppid == pid else None
        if argv is not None:
            out.append((child, " ".join(argv)))
    return out


@pytest.mark.slow
def test_launched_arrow_loads_run_in_workers_of_the_code_server(tmp_path, monkeypatch):
    import dagster as dg
    from dagster._cli.job import _create_run
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.metadata.loader import load_metadata
    from lakehouse.metadata.store import MetadataStore

    home = tmp_path
    env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}",
           "LAKEHOUSE_CATALOG_NAME": "lake_rw", "LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
           "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}", "LAKEHOUSE_DATAHUB": "off",
           "DAGSTER_HOME": str(home / "dagster"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LAKEHOUSE_LANDING_DIR", raising=False)
    (home / "apps.yaml").write_text("""
sources:
  - {source_id: extract, kind: files, format: parquet, path: extract/crm, glob: "*.parquet",
     options: {connection_qualified_name: "default/crm/1", tenant_id: acme}}
applications:
  - {application_id: salesforce, source_id: extract, engine: arrow}
""")
    MetadataStore(env["LAKEHOUSE_CONTROL_DB_URL"]).apply(load_metadata(home / "apps.yaml"))
    dh = home / "dagster"
    dh.mkdir()
    (dh / "dagster.yaml").write_text(yaml.safe_dump({
        "telemetry": {"enabled": False}, "code_servers": {"local_startup_timeout": 600},
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}))
    (dh / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [{"python_module": {
        "module_name": "lakehouse_assets.definitions", "attribute": "defs", "location_name": "lakehouse",
        "working_directory": str(REPO), "executable_path": sys.executable}}]}))
    instance = dg.DagsterInstance.from_config(str(dh))
    landing = home / "landing" / "extract" / "crm"
    with WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(dh / "workspace.yaml")])) as ctx:
        assert any("grpc" in cmd for _pid, cmd in _children(os.getpid()))  # a code server of its own
        for n in (1, 2):
            path = landing / "wf" / f"run{n}" / "raw" / "account" / "chunk-0.parquet"
            path.parent.mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist([{"name": f"r{n}_{i}", "pos": i} for i in range(3)]), path)
            req = ctx.create_request_context()
            loc = req.get_code_location("lakehouse")
            assert req.get_code_location_error("lakehouse") is None
            repo = next(iter(loc.get_repositories().values()))
            run = _create_run(instance=instance, code_location=loc, remote_repo=repo,
                              remote_job=repo.get_full_job("entity_raw__salesforce__load_job"), run_config={},
                              tags={}, op_selection=None, run_id=None)
            instance.submit_run(run.run_id, req)
            deadline = time.monotonic() + 300
            while instance.get_run_by_id(run.run_id).status.value not in ("SUCCESS", "FAILURE", "CANCELED"):
                assert time.monotonic() < deadline, "the run did not finish in 300 s"
                time.sleep(0.2)
            logs = [e.user_message for e in instance.all_logs(run.run_id)]
            assert instance.get_run_by_id(run.run_id).status.value == "SUCCESS", "\n".join(logs[-20:])
            assert any("1 file(s), 3 row(s)" in m for m in logs), logs  # the step's own log reached the run
    table = SqlCatalog("lake_rw", uri=env["LAKEHOUSE_CATALOG_URI"], warehouse=env["LAKEHOUSE_WAREHOUSE"]
                       ).load_table("entity_raw.salesforce")
    assert table.scan().to_arrow().num_rows == 6
