"""The code server builds the repository's UI snapshot once per process (fast lane, no Spark).

After a reload three clients (the webserver's reload, its watcher, the daemon) ask the new code
server for `RepositorySnap.from_def` at once; Dagster's server builds it per request. The lakehouse
repository builds it once and hands the same snapshot to every asker (issue 22), with the content
Dagster's own `from_def` gives.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dagster as dg
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._serdes import serialize_value

from tests.test_asset_graph_snapshot import demo_platform  # noqa: F401 - the fixture


def test_concurrent_askers_share_one_snapshot_with_dagsters_content(demo_platform):  # noqa: F811
    from lakehouse_assets.definitions import lakehouse_repository

    repo = lakehouse_repository(demo_platform)
    with ThreadPoolExecutor(3) as pool:  # the three clients of a reload, at the same moment
        snaps = list(pool.map(lambda _: RepositorySnap.from_def(repo, defer_snapshots=True), range(3)))
    assert snaps[0] is snaps[1] is snaps[2]
    # what Dagster's own from_def builds for the same repository, unshared
    own = RepositorySnap.from_def.__func__.__wrapped__(RepositorySnap, repo, defer_snapshots=True)
    assert serialize_value(own) == serialize_value(snaps[0])
    assert {n.asset_key.to_user_string() for n in snaps[0].asset_nodes} >= {"silver/user_events", "gold/daily_user_events"}
    # the other kind (every job's full snapshot) is its own, and not the deferred one
    full = RepositorySnap.from_def(repo, defer_snapshots=False)
    assert full.job_datas and full is not snaps[0] and RepositorySnap.from_def(repo) is full


def test_other_repositories_are_built_by_dagster_each_time():
    import lakehouse_assets.definitions  # noqa: F401 - installs the shared snapshot

    @dg.asset
    def plain():
        return 1

    repo = dg.Definitions(assets=[plain]).get_repository_def()
    a, b = RepositorySnap.from_def(repo, defer_snapshots=True), RepositorySnap.from_def(repo, defer_snapshots=True)
    assert a is not b and serialize_value(a) == serialize_value(b)
