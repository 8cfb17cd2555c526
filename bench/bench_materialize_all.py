"""The demo's "Materialize all" as the UI launches it: click (submit) to SUCCESS (issue 21).

    .venv/bin/python bench/bench_materialize_all.py --rounds 3                       # this tree
    .venv/bin/python bench/bench_materialize_all.py --rounds 3 --baseline /tmp/base   # before / after

What a new user does after `./scripts/up.sh`: the demo's 200,000 events landed (`lakehouse demo`), the
metadata applied, the code location loaded, then *Assets -> Materialize all*. Each round and side gets
a fresh home (control DB, catalog, warehouse, Dagster instance) and its own code server, started and
loaded before the clock starts, as the UI's is before the click; the run is launched through
Dagster's GraphQL `launchPipelineExecution` with every asset of the demo selected (the mutation the
UI sends; `dagster_graphql.test.utils.materialize_assets`), by Dagster's DefaultRunLauncher: the code
server's run worker runs the three stages, and the bench polls the run's status. The instance uses
DefaultRunCoordinator (launched at submit): `dagster dev`'s queue adds only the daemon's dequeue
wait, the same on both sides. `--baseline DIR`: a `git archive` copy of another commit, alternated
with this tree round by round (the first side flips per round); medians and the ratio are printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import demo_landing  # noqa: E402  (one copy of the demo's landing)

REPO = Path(__file__).resolve().parent.parent


class Side:
    """One source tree's fresh home, instance and code server for one round."""

    def __init__(self, repo: Path, home: Path, landing: Path):
        self.repo, self.home = repo, home
        self.env = {"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_LANDING_DIR": str(landing),
                    "DAGSTER_HOME": str(home / "dagster")}
        dh = home / "dagster"
        dh.mkdir(parents=True)
        config = {"telemetry": {"enabled": False}, "code_servers": {"local_startup_timeout": 600},
                  "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}}
        (dh / "dagster.yaml").write_text(yaml.safe_dump(config))
        workspace = {"load_from": [{"python_module": {"module_name": "lakehouse_assets.definitions", "attribute": "defs",
                                                      "location_name": "lakehouse", "working_directory": str(repo),
                                                      "executable_path": sys.executable}}]}
        (dh / "workspace.yaml").write_text(yaml.safe_dump(workspace))

    def start(self) -> None:
        """Apply the demo's metadata and start the code server (its output, and its run workers', goes
        to <home>/code_server.log: they inherit the descriptors they are spawned with)."""
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds = os.dup(1), os.dup(2)
        log = os.open(self.home / "code_server.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        # the code server, and the run workers it spawns, run `python -m` in this process's working
        # directory, which Python puts ahead of PYTHONPATH on sys.path: started in another tree, a
        # baseline side would import that tree's packages, not its own
        cwd = os.getcwd()
        os.chdir(self.repo)
        try:
            self._start()
        finally:
            os.chdir(cwd)
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            os.close(saved_fds[0])
            os.close(saved_fds[1])

    def _start(self) -> None:
        env = {**os.environ, **self.env, "PYTHONPATH": str(self.repo)}
        subprocess.run([sys.executable, "-m", "lakehouse.cli", "metadata", "apply", str(self.repo / "metadata" / "demo")],
                       cwd=self.repo, env=env, check=True, capture_output=True)
        import dagster as dg
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget

        saved = {k: os.environ.get(k) for k in (*self.env, "PYTHONPATH")}
        os.environ.update({**self.env, "PYTHONPATH": str(self.repo)})  # the code server inherits them
        try:
            self.instance = dg.DagsterInstance.from_config(str(self.home / "dagster"))
            self.ctx = WorkspaceProcessContext(self.instance, WorkspaceFileTarget(
                paths=[str(self.home / "dagster" / "workspace.yaml")]))
            self.ctx.__enter__()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        req = self.ctx.create_request_context()
        err = req.get_code_location_error("lakehouse")
        if err is not None:
            raise RuntimeError(err.to_string())

    def materialize_all(self) -> tuple[float, str]:
        """Seconds from the launch to the run's final status, and that status."""
        from dagster_graphql.test.utils import materialize_assets

        req = self.ctx.create_request_context()
        repo = next(iter(req.get_code_location("lakehouse").get_repositories().values()))
        keys = [node.key for node in repo.asset_graph.asset_nodes if node.is_materializable]
        started = time.monotonic()
        result = materialize_assets(req, keys)
        data = result.data["launchPipelineExecution"]
        if data["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launch failed: {data}")
        run_id = data["run"]["runId"]
        while True:
            run = self.instance.get_run_by_id(run_id)
            if run.status.value in ("SUCCESS", "FAILURE", "CANCELED"):
                self.run_id = run_id
                return time.monotonic() - started, run.status.value
            time.sleep(0.1)

    def steps(self) -> str:
        """Where the run's time went: the launch to the first step's start, each step's seconds, and
        the last step's end to the run's end (from the run's event log)."""
        from dagster import DagsterEventType as E

        events = self.instance.all_logs(self.run_id, of_type={E.RUN_START, E.STEP_START, E.STEP_SUCCESS,
                                                              E.STEP_FAILURE, E.RUN_SUCCESS, E.RUN_FAILURE})
        first = events[0].timestamp
        begun: dict[str, float] = {}
        parts = []
        for e in events:
            kind = e.dagster_event.event_type
            if kind == E.STEP_START:
                begun[e.step_key] = e.timestamp
                if len(begun) == 1:
                    parts.append(f"to first step {e.timestamp - first:.1f}")
            elif kind in (E.STEP_SUCCESS, E.STEP_FAILURE):
                parts.append(f"{e.step_key} {e.timestamp - begun.get(e.step_key, e.timestamp):.1f}")
                last = e.timestamp
            elif kind in (E.RUN_SUCCESS, E.RUN_FAILURE) and begun:
                parts.append(f"to run end {e.timestamp - last:.1f}")
        return ", ".join(parts)

    def close(self) -> None:
        self.ctx.__exit__(None, None, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--steps", action="store_true", help="each run's step timeline from its event log")
    ap.add_argument("--baseline", type=Path, help="a `git archive` copy of another commit, timed in the same rounds")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_materialize_all_"))
    landing = demo_landing(work, args.rows)
    trees = {"this": REPO} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    walls: dict[str, list[float]] = {k: [] for k in trees}
    try:
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for name, repo in order:
                side = Side(repo, work / f"{name}_{r}", landing)
                side.start()
                try:
                    wall, status = side.materialize_all()
                finally:
                    side.close()
                if status != "SUCCESS":
                    raise SystemExit(f"round {r + 1} {name}: the run ended {status} (home {side.home})")
                walls[name].append(wall)
                print(f"round {r + 1} {name:8s} Materialize all: {wall:6.2f} s  load {os.getloadavg()[0]:.1f}",
                      flush=True)
                if args.steps:
                    print(f"    seconds (run start ->): {side.steps()}", flush=True)
                shutil.rmtree(side.home, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    for k, v in med.items():
        print(f"{k:8s} median {v:.2f} s over {args.rounds} rounds")
    if "baseline" in med:
        print(f"this / baseline: {med['this'] / med['baseline']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
