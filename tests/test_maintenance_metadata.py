"""Maintenance metadata (fast lane, no Spark): a malformed block or platform default is rejected on
load naming the file, row and field; the effective policy is the target's block over the platform
settings over the built-in defaults; the schedule is per namespace."""

from __future__ import annotations

import pytest

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.table import maintenance


def test_malformed_maintenance_block_names_the_field(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("""
targets:
  - target_id: t
    namespace: ns
    table: t
    maintenance: {orphan_min_age_hours: 1, snapshot_max_age_hourz: 3}
platform_settings:
  - {setting_key: maintenance.min_snapshots_to_keep, setting_value: "zero"}
  - {setting_key: maintenance.schedule.bronze, setting_value: "every day"}
  - {setting_key: maintenance.compaction, setting_value: "on"}
""")
    with pytest.raises(MetadataError) as e:
        load_metadata(f)
    text = str(e.value)
    assert "bad.yaml: targets[0].maintenance.orphan_min_age_hours: Input should be greater than or equal to 24" \
        in text
    assert "bad.yaml: targets[0].maintenance.snapshot_max_age_hourz: Extra inputs are not permitted" in text
    assert "bad.yaml: platform_settings[0]" in text and "maintenance.min_snapshots_to_keep: Input should be a valid " \
        "integer" in text
    assert "bad.yaml: platform_settings[1]" in text and "'every day' is not a cron expression" in text
    assert "bad.yaml: platform_settings[2]" in text and "maintenance.compaction: unknown maintenance setting" in text


def test_policy_layers_and_schedules(tmp_path):
    f = tmp_path / "ok.yaml"
    f.write_text("""
targets:
  - {target_id: a, namespace: bronze, table: a, maintenance: {min_snapshots_to_keep: 3, rewrite_manifests: false}}
  - {target_id: b, namespace: silver, table: b}
platform_settings:
  - {setting_key: maintenance.min_snapshots_to_keep, setting_value: "20"}
  - {setting_key: maintenance.target_file_size_mb, setting_value: "256"}
  - {setting_key: maintenance.schedule, setting_value: "0 4 * * *"}
  - {setting_key: maintenance.schedule.bronze, setting_value: "*/30 * * * *"}
""")
    cat = load_metadata(f).catalog
    a, b = maintenance.policy(cat, cat.target("a")), maintenance.policy(cat, cat.target("b"))
    assert (a.min_snapshots_to_keep, a.rewrite_manifests, a.target_file_size_mb) == (3, False, 256)
    assert (b.min_snapshots_to_keep, b.rewrite_manifests, b.target_file_size_mb) == (20, True, 256)
    assert b.orphan_min_age_hours == maintenance.DEFAULTS.orphan_min_age_hours
    assert maintenance.schedule(cat, "bronze") == "*/30 * * * *"
    assert maintenance.schedule(cat, "silver") == "0 4 * * *"
    assert list(maintenance.namespaces(cat)) == ["bronze", "silver"]
    with pytest.raises(KeyError, match="unknown table 'gold.x'.*known: \\['bronze.a', 'silver.b'\\]"):
        maintenance.resolve_target(cat, "gold.x")


def test_entity_raw_tables_are_maintained_with_the_platform_defaults(tmp_path):
    f = tmp_path / "apps.yaml"
    f.write_text("""
targets:
  - {target_id: a, namespace: bronze, table: a}
applications:
  - {application_id: Tableau}
  - {application_id: off_app, enabled: false}
""")
    cat = load_metadata(f).catalog
    assert {ns: [t.identifier for t in ts] for ns, ts in maintenance.namespaces(cat).items()} == {
        "bronze": ["bronze.a"], "entity_raw": ["entity_raw.tableau"]}
    raw = maintenance.resolve_target(cat, "entity_raw.tableau")
    assert raw.target_id == "entity_raw:tableau" and maintenance.resolve_target(cat, "entity_raw:tableau") == raw
    assert maintenance.policy(cat, raw) == maintenance.DEFAULTS


def test_documented_defaults_are_the_defaults():
    """The model's field descriptions (docs/metadata-reference.md) state the built-in defaults."""
    from lakehouse.metadata.model import Maintenance

    for name, info in Maintenance.model_fields.items():
        value = getattr(maintenance.DEFAULTS, name)
        shown = str(value).lower() if isinstance(value, bool) else f"{value:g}"
        assert f"(default {shown}" in info.description, (name, value, info.description)


def test_maintenance_assets_one_op_per_namespace_in_its_pool():
    """One op per namespace however many tables it holds (a thousand per-table ops cost the code
    server seconds per load: issue 22), in the namespace's maintenance pool."""
    from lakehouse.metadata.model import MetadataCatalog, Target
    from lakehouse_assets.maintenance_assets import maintenance_definitions

    cat = MetadataCatalog(targets=[Target(target_id="a.b", namespace="bronze", table="x"),
                                   Target(target_id="a_b", namespace="bronze", table="y"),
                                   Target(target_id="s", namespace="silver", table="z")])
    d = maintenance_definitions(cat)
    assert [(a.key.to_user_string(), a.op.name, a.op.pool) for a in d["assets"]] == [
        ("maintenance/bronze", "maintenance__bronze", "maintenance:bronze"),
        ("maintenance/silver", "maintenance__silver", "maintenance:silver")]
    assert [(s.name, s.cron_schedule) for s in d["schedules"]] == [
        ("maintenance__bronze__schedule", maintenance.DEFAULT_SCHEDULE),
        ("maintenance__silver__schedule", maintenance.DEFAULT_SCHEDULE)]
    # no job per namespace either: the schedule runs the asset job with the namespace's asset selected
    import dagster as dg

    sched = d["schedules"][0]
    [req] = sched.evaluate_tick(dg.build_schedule_context()).run_requests
    assert not d["jobs"] and sched.job_name == "__ASSET_JOB"
    assert req.asset_selection == [dg.AssetKey(["maintenance", "bronze"])]
    assert req.tags["lakehouse/maintenance"] == "bronze"


def test_demo_maintenance_assets_list_their_tables_without_depending_on_them():
    """One asset per namespace naming its tables (`tables`), with no edge from each table: at 1,000
    pipelines those edges were ~2.4 MB of every reload's snapshots (issue 22); the op reads the
    namespace's tables at run time."""
    from pathlib import Path

    from lakehouse_assets.maintenance_assets import maintenance_definitions

    cat = load_metadata(Path(__file__).resolve().parent.parent / "metadata" / "demo").catalog
    assets = {a.key.to_user_string(): a for a in maintenance_definitions(cat)["assets"]}
    assert {k: (sorted(a.dependency_keys), a.metadata_by_key[a.key]["tables"]) for k, a in assets.items()} == {
        "maintenance/bronze": ([], "bronze.user_events"), "maintenance/silver": ([], "silver.user_events"),
        "maintenance/gold": ([], "gold.daily_user_events"), "maintenance/entity_raw": ([], "entity_raw.demo_app")}


def test_quarantine_tables_are_maintained_with_their_tables(tmp_path):
    """Each table is followed by its quarantine table once that exists, under the table's policy; the
    quarantine table takes its table's lock, leases, kill switch and pool (owner)."""
    f = tmp_path / "q.yaml"
    f.write_text("""
targets:
  - {target_id: a, namespace: bronze, table: a, maintenance: {min_snapshots_to_keep: 3}}
  - {target_id: b, namespace: bronze, table: b}
applications:
  - {application_id: Tableau}
""")
    cat = load_metadata(f).catalog
    exists = {"bronze.a__quarantine", "entity_raw.tableau__quarantine"}.__contains__
    got = {ns: [t.identifier for t in ts] for ns, ts in maintenance.namespaces(cat, exists).items()}
    assert got == {"bronze": ["bronze.a", "bronze.a__quarantine", "bronze.b"],
                   "entity_raw": ["entity_raw.tableau", "entity_raw.tableau__quarantine"]}
    assert [t.identifier for t in maintenance.maintained_tables(cat)] == ["bronze.a", "bronze.b", "entity_raw.tableau"]
    q = maintenance.resolve_target(cat, "bronze.a__quarantine")
    assert q.target_id == "a__quarantine" and maintenance.resolve_target(cat, "a__quarantine") == q
    assert maintenance.policy(cat, q) == maintenance.policy(cat, cat.target("a"))
    assert maintenance.policy(cat, q).min_snapshots_to_keep == 3
    o = maintenance.owner(q)
    assert (o.target_id, o.identifier) == ("a", "bronze.a") and maintenance.owner(cat.target("b")) is cat.target("b")
    raw_q = maintenance.resolve_target(cat, "entity_raw.tableau__quarantine")
    assert maintenance.owner(raw_q).target_id == "entity_raw:tableau"
