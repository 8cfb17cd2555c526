"""The code location's lazy repository (`lakehouse_repository`, a `dg.RepositoryData` built on first
need) answers the code server's questions exactly as the repository of `build_definitions()` does:
its UI snapshot (`RepositorySnap`, what the code server sends) is the same, and concurrent askers
(the three clients of a reload) build the graph once (fast lane, no Spark)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._serdes import serialize_value

from tests.test_asset_graph_snapshot import demo_platform  # noqa: F401 - the fixture


def test_the_lazy_repository_snapshots_as_the_built_one(demo_platform, tmp_path, monkeypatch):  # noqa: F811
    from lakehouse_assets.definitions import build_definitions, lakehouse_repository

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("LAKEHOUSE_DEFS_TRACE", str(trace))
    repo = lakehouse_repository(demo_platform)
    with ThreadPoolExecutor(3) as pool:  # the three clients of a reload, at the same moment
        snaps = list(pool.map(lambda _: serialize_value(RepositorySnap.from_def(repo, defer_snapshots=True)), range(3)))
    assert len(trace.read_text().splitlines()) == 1  # one build for the three askers
    built = build_definitions(demo_platform).get_repository_def()
    assert snaps[0] == snaps[1] == snaps[2] == serialize_value(RepositorySnap.from_def(built, defer_snapshots=True))
    snap = json.loads(snaps[0])
    assert snap  # a real snapshot, with the demo's stage assets
    assert {n.asset_key.to_user_string() for n in RepositorySnap.from_def(repo, defer_snapshots=True).asset_nodes} >= {
        "silver/user_events", "gold/daily_user_events"}
