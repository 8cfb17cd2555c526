"""The code location built from `metadata/demo`, as a reviewed snapshot (syrupy), in the fast lane.

What the graph looks like (asset keys, deps, groups, kinds, tags, partitions, the ops' pools and
priority tags, asset check specs, jobs, sensors and schedules) is the contract between metadata and Dagster: a
change to it should be seen in review, not discovered in the UI. The serialization is a sorted,
plain dict so a diff reads as "this asset gained a dep", not as object reprs.

A change to the graph that is meant: `pytest tests/test_asset_graph_snapshot.py --snapshot-update`,
and review the diff of `__snapshots__/test_asset_graph_snapshot.ambr`.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.settings import load_settings
from lakehouse.throughput.profiles import op_priority
from tests.conftest import seed_control_db

DEMO = Path(__file__).resolve().parent.parent / "metadata" / "demo"


@pytest.fixture
def demo_platform(tmp_path, monkeypatch, control_db_at_head) -> Platform:
    """A platform on a fresh home after `lakehouse metadata apply metadata/demo` (no Spark)."""
    seed_control_db(control_db_at_head, tmp_path)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME",
                "LAKEHOUSE_METADATA_DIR", "LAKEHOUSE_S3_ENDPOINT_URL", "LAKEHOUSE_DEFS_TRACE"):
        monkeypatch.delenv(var, raising=False)
    settings = load_settings()
    store = MetadataStore(settings.control_db_url)
    store.apply(load_metadata(DEMO))
    return Platform(settings, store)


@pytest.fixture
def demo_defs(demo_platform) -> dg.Definitions:
    """The definitions a code server builds after `lakehouse metadata apply metadata/demo`."""
    from lakehouse_assets.definitions import build_definitions

    return build_definitions(demo_platform)


def _key(key: dg.AssetKey) -> str:
    return key.to_user_string()


def _ops(assets_def: dg.AssetsDefinition) -> dict:
    """Each op of the asset: its pool (the throttle it claims a slot of) and its tags (priority)."""
    return {op.name: {"pool": op.pool, "tags": dict(sorted((op.tags or {}).items()))}
            for op in sorted(assets_def.node_def.iterate_op_defs(), key=lambda o: o.name)}


def _partitions(partitions_def) -> str | None:
    """A time-partitioned asset as `DailyPartitionsDefinition from 2024-01-01`; None when unpartitioned."""
    if partitions_def is None:
        return None
    start = getattr(partitions_def, "start", None)
    return type(partitions_def).__name__ + (f" from {start.date().isoformat()}" if start is not None else "")


def _plain_metadata_keys(metadata) -> list[str]:
    return sorted(metadata or {})


def serialize(defs: dg.Definitions) -> dict:
    """The graph as sorted plain data: deterministic across builds and machines (no paths, no ids)."""
    graph = defs.resolve_asset_graph()
    assets: dict[str, dict] = {}
    for node in sorted(graph.asset_nodes, key=lambda n: _key(n.key)):
        entry = {
            "group": node.group_name,
            "deps": sorted(_key(k) for k in node.parent_keys),
            "kinds": sorted(node.kinds),
            "tags": dict(sorted((node.tags or {}).items())),
            "owners": sorted(node.owners or []),
            "materializable": node.is_materializable,
            "partitions": _partitions(node.partitions_def),
            "metadata_keys": _plain_metadata_keys(node.metadata),
            "checks": {},
        }
        for check_key in sorted(node.check_keys, key=lambda c: c.name):
            spec = graph.get_check_spec(check_key)
            entry["checks"][check_key.name] = {"blocking": spec.blocking, "description": spec.description,
                                               "metadata_keys": _plain_metadata_keys(spec.metadata)}
        assets[_key(node.key)] = entry
    ops = {}
    for a in defs.assets or []:
        if isinstance(a, dg.AssetsDefinition):
            ops[", ".join(sorted(_key(k) for k in a.keys))] = _ops(a)
    jobs = {}
    for job in sorted(defs.jobs or [], key=lambda j: j.name):
        resolved = defs.resolve_job_def(job.name)
        jobs[job.name] = {"assets": sorted(_key(k) for k in resolved.asset_layer.selected_asset_keys),
                          "tags": dict(sorted((resolved.tags or {}).items()))}
    sensors = {s.name: {"jobs": sorted(j.name for j in s.jobs) if s.has_jobs else [],
                        "default_status": s.default_status.value,
                        "minimum_interval_seconds": s.minimum_interval_seconds}
               for s in sorted(defs.sensors or [], key=lambda s: s.name)}
    schedules = {s.name: {"cron": s.cron_schedule, "job": s.job_name, "default_status": s.default_status.value}
                 for s in sorted(defs.schedules or [], key=lambda s: s.name)}
    return {"assets": assets, "ops_by_asset": ops, "jobs": jobs, "sensors": sensors, "schedules": schedules,
            "resources": sorted(defs.resources or {})}


def test_demo_asset_graph_matches_the_snapshot(demo_defs, snapshot):
    assert serialize(demo_defs) == snapshot


def test_the_serialization_is_deterministic(demo_defs):
    """Two builds serialize alike: the snapshot can only change when the graph does."""
    from lakehouse_assets.definitions import build_definitions

    settings = load_settings()
    assert serialize(build_definitions(Platform(settings, MetadataStore(settings.control_db_url)))) == \
        serialize(demo_defs)


def test_the_serialization_sees_a_metadata_change(demo_defs, tmp_path):
    """The snapshot can fail: the demo pipeline's criticality lowered in metadata changes the ops'
    priority tags, and only those."""
    import shutil

    import yaml

    from lakehouse_assets.definitions import build_definitions

    before = serialize(demo_defs)
    meta = tmp_path / "meta"
    shutil.copytree(DEMO, meta)
    doc = yaml.safe_load((meta / "user_events.yaml").read_text())
    doc["pipelines"][0]["criticality"] = "low"
    (meta / "user_events.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    settings = load_settings()
    store = MetadataStore(settings.control_db_url)
    store.apply(load_metadata(meta))
    after = serialize(build_definitions(Platform(settings, store)))
    changed = {name: ops for name, ops in after["ops_by_asset"].items() if before["ops_by_asset"][name] != ops}
    assert sorted(changed) == ["bronze/user_events", "gold/daily_user_events", "silver/user_events"]
    assert {op["tags"]["dagster/priority"] for ops in changed.values() for op in ops.values()} == \
        {str(op_priority("low"))}
    assert {k: v for k, v in after.items() if k != "ops_by_asset"} == \
        {k: v for k, v in before.items() if k != "ops_by_asset"}


def test_a_stage_asset_says_its_pipeline_stage_and_write_mode_once(demo_defs):
    """The pipeline, the stage and the write mode are in the asset's description (the pipeline also in
    its `lakehouse/pipeline` tag), not repeated as metadata entries, which every client fetches again
    on every reload (issue 22)."""
    spec = demo_defs.resolve_assets_def(dg.AssetKey(["silver", "user_events"])).specs_by_key[dg.AssetKey(["silver", "user_events"])]
    assert "Pipeline `user_events_etl`, stage 2 `silver_clean`, write mode `overwrite`." in spec.description
    assert spec.tags["lakehouse/pipeline"] == "user_events_etl"
    assert spec.metadata["table"] == "silver.user_events" and "```sql" in spec.metadata["transformation"].value
    assert not {"pipeline", "stage", "write_mode"} & set(spec.metadata)
