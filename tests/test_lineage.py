"""Lineage surfaces: deps and column lineage from SQL on the Dagster assets, and
`lakehouse lineage paths DATASET` listing routes, costs, availability and the route used now."""

from __future__ import annotations

import io
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import dagster as dg

from lakehouse.metadata.loader import load_metadata
from tests.test_recovery import demo_with_replica

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"


def cli(*argv: str) -> subprocess.CompletedProcess:
    """`lakehouse ARGV` through the CLI's own entry point, in this process: the same parser, commands
    and exit codes as the installed script (which the slow lane runs), without a Python start and
    the platform's imports per command (the fast lane's slowest test was six such processes)."""
    from lakehouse.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(["lakehouse", *argv], code, out.getvalue(), err.getvalue())


def test_dagster_assets_carry_sql_deps_and_column_lineage(settings):
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.stage.runner import Platform
    from lakehouse_assets.definitions import build_definitions

    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.store.apply(load_metadata(DEMO))
    defs = build_definitions(platform)
    graph = defs.resolve_asset_graph()
    gold = dg.AssetKey(["gold", "daily_user_events"])
    assert graph.get(gold).parent_keys == {dg.AssetKey(["silver", "user_events"])}  # derived from the SQL
    spec = next(s for s in defs.resolve_all_asset_specs() if s.key == gold)
    lineage = spec.metadata["dagster/column_lineage"]
    deps = {col: [(d.asset_key.to_user_string(), d.column_name) for d in ds]
            for col, ds in lineage.deps_by_column.items()}
    assert deps == {"event_date": [("silver/user_events", "event_ts")],
                    "unique_users": [("silver/user_events", "user_id")]}


def test_lineage_paths_cli(settings, tmp_path):
    assert cli("metadata", "apply", str(demo_with_replica(tmp_path))).returncode == 0
    (settings.landing_dir / "user_events_replica").mkdir(parents=True)
    res = cli("lineage", "paths", "bronze_user_events")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    raw = next(ln for ln in lines if ln.split()[1:2] == ["user_events_raw"])
    replica = next(ln for ln in lines if ln.split()[1:2] == ["user_events_replica"])
    archive = next(ln for ln in lines if ln.split()[1:2] == ["user_events_archive"])
    assert " 1 " in raw and "no: user_events_raw: landing directory" in raw and "used now" not in raw
    assert " 3 " in replica and " yes " in replica and "<== used now" in replica
    assert " 10 " in archive and "used now" not in archive
    assert "would use: user_events_replica -> bronze_user_events (cost 3)" in res.stdout

    res = cli("lineage", "paths", "gold_daily_user_events")
    assert "user_events_replica -> bronze_user_events -> silver_user_events -> gold_daily_user_events" in res.stdout
    res = cli("lineage", "paths", "no_such_dataset")
    assert res.returncode == 2 and "unknown dataset 'no_such_dataset'" in res.stderr

    res = cli("lineage", "sync")
    assert res.returncode == 0 and "dataset_recovery_paths:" in res.stdout
    res = cli("lineage", "columns", "gold_daily_user_events")
    assert "unique_users" in res.stdout and "user_id" in res.stdout
