"""Maintenance of young tables costs no Spark (fast lane: no JVM may start in these tests).

Tables are written with PyIceberg only. A table written seconds ago, with more small files and more
snapshots than the policy's counts but one file per partition, has nothing due: no partition holds two
files to bin-pack, no snapshot is old enough to expire, no file under its location is old enough to be
an orphan; `maintain` says so in its reasons and the audit log, and the namespace's maintenance asset
materializes without starting a SparkSession. An old file planted in a young table's location (a
table re-created where an old one lived), or a real small-file backlog in one partition, is still due.
The location's listing goes through the platform's S3 client on S3 (moto server)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.stage.runner import Platform
from lakehouse.table import maintenance

NS = "young"


@pytest.fixture
def platform(settings, tmp_path):
    p = Platform(settings, MetadataStore(settings.control_db_url))
    f = tmp_path / "young.yaml"
    f.write_text(f"""
targets:
  - {{target_id: daily, namespace: {NS}, table: daily}}
""")
    p.store.apply(load_metadata(f))
    return p


@pytest.fixture
def no_spark(monkeypatch):
    """Asking for the SparkSession fails the test (also in a session whose slow tests started one); on
    return no session was started or is starting that was not before (lakehouse.runtime.spark.started_or_starting)."""
    from lakehouse.runtime import spark

    def refuse(*_args, **_kwargs):
        pytest.fail("maintenance asked for a SparkSession with nothing due", pytrace=False)

    was = spark.started_or_starting()
    monkeypatch.setattr(spark, "get_spark", refuse)
    yield
    assert spark.started_or_starting() == was


def _daily(platform, days: list[list[int]]):
    """`young.daily` partitioned by `day`, one PyIceberg append per list of days (a file per day each)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField

    cat = platform.pyiceberg_catalog()
    cat.create_namespace_if_not_exists(NS)
    schema = Schema(NestedField(1, "day", LongType(), required=False), NestedField(2, "n", LongType(), required=False))
    tbl = cat.create_table(f"{NS}.daily", schema=schema,
                           partition_spec=PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "day")))
    for batch in days:
        tbl.append(pa.table({"day": pa.array(batch, pa.int64()), "n": pa.array(batch, pa.int64())}))
    return cat.load_table(f"{NS}.daily")


def test_a_young_table_has_nothing_due_and_starts_no_spark(platform, no_spark):
    # 7 one-day appends, then one of 5 more days: 12 small files (policy: more than 10), 8 snapshots
    # (more than the 5 kept), 8 manifests, every partition one file; all written just now
    _daily(platform, [[d] for d in range(7)] + [list(range(7, 12))])
    res = maintenance.maintain(platform, platform.catalog().target("daily"))
    assert (res["files_before"], res["small_files_before"], res["snapshots_before"]) == (12, 12, 8)
    assert res["due"] == [] and res["files_after"] == 12 and "data_files_rewritten" not in res
    why = res["reasons"]
    assert why["compact"].startswith("12 of 12 live file(s) under 32 MB (more than 10), but no partition holds "
                                     "two files to bin-pack together")
    assert why["expire"].startswith("8 snapshot(s), keep the newest 5") and \
        why["expire"].endswith(": none is older, no ref past its max-ref-age")
    assert "none can be, no file under the table's location is modified before" in why["orphans"]
    [entry] = [e for e in platform.store.audit_entries(limit=10) if e.event == maintenance.AUDIT_EVENT]
    assert (entry.outcome, entry.message, entry.details["reasons"]) == ("success", "nothing due", why)

    dry = maintenance.maintain(platform, platform.catalog().target("daily"), dry_run=True)
    assert dry["due"] == [] and dry["orphan_files_found"] == 0


def test_the_namespace_asset_of_quiet_tables_materializes_without_spark(platform, no_spark):
    import dagster as dg

    from lakehouse_assets.maintenance_assets import asset_key, maintenance_definitions
    from resources import LakehouseResource

    _daily(platform, [list(range(12))])
    [asset] = maintenance_definitions(platform.catalog())["assets"]
    result = dg.materialize([asset], resources={"lakehouse": LakehouseResource()})
    assert result.success
    [mat] = [m for m in result.get_asset_materialization_events() if m.asset_key == asset_key(NS)]
    md = mat.materialization.metadata
    assert f"| {NS}.daily | nothing due | 12 → 12 |" in md["results"].value
    assert md["files_after"].value == 12 and md["data_files_rewritten"].value == 0


def test_what_is_really_due_in_a_young_table_stays_due(platform):
    # a backlog in one partition: 11 appends to day 0 (and one other day)
    tbl = _daily(platform, [[0] for _ in range(11)] + [[1]])
    p = maintenance.plan(platform, platform.tables(), platform.catalog(), platform.catalog().target("daily"))
    assert p.compact and p.before.partitions_to_pack == 1 and "1 partition(s) to bin-pack" in p.reasons["compact"]
    assert not p.orphans and p.no_old_files
    assert not p.expire and p.reasons["expire"].endswith(": none is older, no ref past its max-ref-age")

    # a branch whose own max-snapshot-age is shorter than the policy's: its older ancestors can expire
    time.sleep(0.01)
    tbl.manage_snapshots().create_branch(tbl.current_snapshot().snapshot_id, "short", max_snapshot_age_ms=5).commit()
    p = maintenance.plan(platform, platform.tables(), platform.catalog(), platform.catalog().target("daily"))
    assert p.expire and ": 11 snapshot(s) older than" in p.reasons["expire"]  # all but the heads

    # an old file in the young table's location (a table re-created where an old one lived)
    old = Path(tbl.metadata.location.removeprefix("file:")) / "data" / "left-behind.parquet"
    old.write_bytes(b"from the table that lived here before")
    four_days_ago = time.time() - 96 * 3600  # the default minimum age is 72 h
    os.utime(old, (four_days_ago, four_days_ago))
    p = maintenance.plan(platform, platform.tables(), platform.catalog(), platform.catalog().target("daily"))
    assert p.orphans and not p.no_old_files
    assert "the location holds files modified before" in p.reasons["orphans"]


def test_a_location_on_s3_is_listed_with_the_platforms_client(settings, s3_server, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", s3_server.endpoint_url)
    from lakehouse.settings import load_settings

    platform = Platform(load_settings(), MetadataStore(settings.control_db_url))
    bucket, client = s3_server.new_bucket(), s3_server.client()
    for key in ("wh/young/daily/data/a.parquet", "wh/young/daily/metadata/v1.metadata.json",
                "wh/young/daily_old/data/b.parquet"):
        client.put_object(Bucket=bucket, Key=key, Body=b"x")
    now_ms = int(time.time() * 1000)
    for scheme in ("s3", "s3a"):
        location = f"{scheme}://{bucket}/wh/young/daily"
        # every object is younger than a cutoff an hour ago: nothing for remove_orphan_files
        assert maintenance.location_files(platform, location, now_ms - 3600_000) == (None, 2)
        # with a cutoff an hour ahead the first is "old"; the sibling table's prefix is not listed
        found, listed = maintenance.location_files(platform, location, now_ms + 3600_000)
        assert found == f"{scheme}://{bucket}/wh/young/daily/data/a.parquet" and listed == 1
    assert maintenance.location_files(platform, f"gs://{bucket}/wh/young/daily", now_ms) is None
