"""CPU of one Dagster run worker: an Arrow entity_raw load launched as the UI, the daemon and
`lakehouse serve` launch runs (issue 21, h29a).

Dagster's DefaultRunLauncher asks the code server (`dagster api grpc`) to start the run; the code
server spawns the run worker (a `multiprocessing` spawn child) and reaps it when it ends, so the
worker's CPU is the code server's reaped-children CPU (cutime + cstime of /proc/<pid>/stat) across
the run. Each round lands one small parquet file and launches `entity_raw__salesforce__load_job`
(engine arrow: no JVM), as tests/test_load_service.py does through the daemon.

    .venv/bin/python bench/bench_run_worker.py --rounds 8                    # this tree
    .venv/bin/python bench/bench_run_worker.py --rounds 8 --baseline /tmp/main   # A/B, alternating

`--baseline DIR`: a `git archive main` copy; rounds alternate between the two trees (each with its own
code server and home) and the ratios are printed side by side. `--instance dev` uses
deploy/dagster.dev.yaml's storage and compute logs (the platform's SQLite storage, the thread
mirror); `--instance stock` (default) Dagster's own SQLite storage, as the load-service test does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from lakehouse.runtime import procstat

REPO = Path(__file__).resolve().parent.parent
META = """
sources:
  - {source_id: extract, kind: files, format: parquet, path: extract/redshift, glob: "*.parquet",
     options: {connection_qualified_name: "default/redshift/1700000000", tenant_id: acme}}
applications:
  - {application_id: salesforce, source_id: extract, engine: arrow}
  - {application_id: redshift, source_id: extract}
"""
JOB = "entity_raw__salesforce__load_job"


def _cpu_children(root: int) -> float:
    """CPU of the processes reaped by the code server or its living descendants (with the fork-server
    start, the fork server reaps the run workers; with spawn, the code server does): cutime + cstime."""
    table = procstat.snapshot()
    return sum(table[p].children_cpu for p in procstat.descendants(root, table) if p in table)


def _cpu_own_descendants(root: int) -> float:
    """Own CPU (utime + stime) of the code server's living descendants (the fork server's one-off preload)."""
    table = procstat.snapshot()
    return sum(table[p].cpu for p in procstat.descendants(root, table)[1:] if p in table)


class Tree:
    """One source tree's home, instance and code server."""

    def __init__(self, repo: Path, home: Path, instance_kind: str):
        self.repo, self.home = repo, home
        self.env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}",
                    "LAKEHOUSE_CATALOG_NAME": "lake_bench", "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
                    "LAKEHOUSE_DATAHUB": "off", "LAKEHOUSE_SPARK_MASTER": "local[1]",
                    "LAKEHOUSE_SHUFFLE_PARTITIONS": "1", "DAGSTER_HOME": str(home / "dagster")}
        dh = home / "dagster"
        dh.mkdir(parents=True)
        config = {"telemetry": {"enabled": False}, "code_servers": {"local_startup_timeout": 600},
                  # launched at submit (the daemon's queue only adds its dequeue wait before the same launch)
                  "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}
        if instance_kind == "dev":
            dev = yaml.safe_load((repo / "deploy" / "dagster.dev.yaml").read_text())
            config.update({k: dev[k] for k in ("storage", "compute_logs") if k in dev})
        (dh / "dagster.yaml").write_text(yaml.safe_dump(config))
        workspace = {"load_from": [{"python_module": {"module_name": "lakehouse_assets.definitions", "attribute": "defs",
                                                      "location_name": "lakehouse", "working_directory": str(repo),
                                                      "executable_path": sys.executable}}]}
        (dh / "workspace.yaml").write_text(yaml.safe_dump(workspace))
        (home / "apps.yaml").write_text(META)
        self.landing = home / "landing" / "extract" / "redshift"
        self.n = 0

    def start(self):
        import subprocess

        env = {**os.environ, **self.env, "PYTHONPATH": str(self.repo)}
        subprocess.run([sys.executable, "-c", "import sys; from lakehouse.cli import main; sys.exit(main())",
                        "metadata", "apply", str(self.home / "apps.yaml")], cwd=self.repo, env=env, check=True,
                       capture_output=True)
        os.environ.update(self.env)
        import dagster as dg
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget

        self.instance = dg.DagsterInstance.from_config(str(self.home / "dagster"))
        old = os.environ.get("PYTHONPATH")
        # the code server (and its run workers) import this tree; BENCH_EXTRA_PATH: e.g. a directory whose
        # sitecustomize.py profiles the run workers (cProfile)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("BENCH_EXTRA_PATH"), str(self.repo)) if p)
        # the code server and its run workers run `python -m` in this process's working directory, which
        # Python puts ahead of PYTHONPATH: started elsewhere, the baseline would import another tree
        cwd = os.getcwd()
        os.chdir(self.repo)
        try:
            self.ctx = WorkspaceProcessContext(self.instance, WorkspaceFileTarget(
                paths=[str(self.home / "dagster" / "workspace.yaml")]))
            self.ctx.__enter__()
            req = self.ctx.create_request_context()
        finally:
            os.chdir(cwd)
            if old is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = old
        err = req.get_code_location_error("lakehouse")
        if err is not None:
            raise RuntimeError(err.to_string())
        self.server = self._code_server_pid()

    def _code_server_pid(self) -> int:
        for pid, st in procstat.snapshot().items():
            if st.ppid != os.getpid():
                continue
            try:
                cmd = " ".join(procstat.cmdline(pid) or ())
                env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "grpc" in cmd and str(self.home) in cmd + env:
                return pid
        raise RuntimeError("no code server child found")

    def round(self) -> tuple[float, float, str]:
        from dagster._cli.job import _create_run

        self.n += 1
        path = self.landing / "wf" / f"run{self.n}" / "raw" / "table" / "chunk-0.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([{"table_name": f"t{i}", "pos": i} for i in range(10)]), path)
        before = _cpu_children(self.server)
        alive = set(procstat.descendants(self.server))  # the code server and its long-lived helpers (a fork server)
        req = self.ctx.create_request_context()
        loc = req.get_code_location("lakehouse")
        repo = next(iter(loc.get_repositories().values()))
        started = time.monotonic()
        run = _create_run(instance=self.instance, code_location=loc, remote_repo=repo,
                          remote_job=repo.get_full_job(JOB), run_config={}, tags={}, op_selection=None, run_id=None)
        self.instance.submit_run(run.run_id, req)
        while True:
            r = self.instance.get_run_by_id(run.run_id)
            if r.status.value in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(0.1)
        wall = time.monotonic() - started
        deadline = time.monotonic() + 60
        while set(procstat.descendants(self.server)) - alive and time.monotonic() < deadline:
            time.sleep(0.1)  # the worker ends and is reaped a moment after the run's status is final
        return _cpu_children(self.server) - before, wall, r.status.value

    def close(self):
        self.ctx.__exit__(None, None, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--baseline", type=Path, help="a `git archive main` copy to compare against")
    ap.add_argument("--instance", choices=("stock", "dev"), default="stock")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_run_worker_"))
    trees = {"this": Tree(REPO, tmp / "this", args.instance)}
    if args.baseline:
        trees["baseline"] = Tree(args.baseline.resolve(), tmp / "baseline", args.instance)
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    print(f"load average before: {os.getloadavg()}", flush=True)
    for t in trees.values():
        t.start()
        t.round()  # warm: the first run creates the table and the instance's run storage
    for i in range(args.rounds):
        for name, t in (trees.items() if i % 2 == 0 else reversed(list(trees.items()))):
            cpu, wall, status = t.round()
            results[name].append((cpu, wall))
            print(f"round {i + 1} {name:8s} worker CPU {cpu:6.2f} s  run wall {wall:6.2f} s  {status}", flush=True)
    for name, t in trees.items():
        print(f"{name:8s} code server's living descendants' own CPU (a fork server's one-off preload): "
              f"{_cpu_own_descendants(t.server):.2f} s")
        t.close()
    print(f"load average after: {os.getloadavg()}")
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in results.items()}
    for k, (c, w) in med.items():
        print(f"{k:8s} median worker CPU {c:.2f} s, median run wall {w:.2f} s over {args.rounds} rounds")
    if "baseline" in med:
        print(f"ratio this/baseline: worker CPU {med['this'][0] / med['baseline'][0]:.3f}x, "
              f"run wall {med['this'][1] / med['baseline'][1]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
