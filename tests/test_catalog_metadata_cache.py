"""The PyIceberg catalog parses a table metadata file once per process, yet every load still sees
the table's current metadata: another writer's commit (another process, or Spark's JVM catalog)
is seen on the next load, exactly as without the cache."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.serializers import FromInputFile

from lakehouse.settings import load_settings
from lakehouse.table.catalog import pyiceberg_catalog
from lakehouse.table.iceberg import IcebergTables


@pytest.fixture
def catalogs(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME"):
        monkeypatch.delenv(var, raising=False)
    settings = load_settings()
    ours = pyiceberg_catalog(settings)
    # a second writer with no cache of its own: a plain SqlCatalog on the same database
    other = SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse)
    ours.create_namespace("bronze")
    return ours, other


@pytest.fixture
def file_reads(monkeypatch):
    reads: list[str] = []
    original = FromInputFile.table_metadata

    def counted(input_file, *args, **kwargs):
        reads.append(input_file.location)
        return original(input_file, *args, **kwargs)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(counted))
    return reads


def test_a_metadata_file_is_read_once(catalogs, file_reads):
    ours, other = catalogs
    other.create_table("bronze.t", schema=pa.schema([("id", pa.int64())])).append(pa.table({"id": [1, 2]}))
    file_reads.clear()  # the other writer's own reads
    first = ours.load_table("bronze.t")
    for _ in range(5):
        again = ours.load_table("bronze.t")
        assert ours.table_exists("bronze.t")
    assert len(file_reads) == 1
    assert again.metadata_location == first.metadata_location
    assert again.current_snapshot().snapshot_id == first.current_snapshot().snapshot_id
    assert again.scan().to_arrow().num_rows == 2  # the cached table's FileIO still reads the data


def test_another_writers_commit_is_seen_on_the_next_load(catalogs, file_reads):
    ours, other = catalogs
    other.create_table("bronze.t", schema=pa.schema([("id", pa.int64())])).append(pa.table({"id": [1]}))
    tables = IcebergTables(spark=lambda: pytest.fail("no Spark for metadata questions"), catalog="lake",
                           meta_catalog=ours)
    before = tables.snapshot_id("bronze.t")
    other.load_table("bronze.t").append(pa.table({"id": [2, 3]}))  # not through our catalog
    after = tables.snapshot_id("bronze.t")
    assert after != before and after == other.load_table("bronze.t").current_snapshot().snapshot_id
    assert tables.snapshot_summary("bronze.t", after)["added-records"] == "2"
    other.load_table("bronze.t").manage_snapshots().create_branch(after, "audit_x").commit()
    assert tables.refs("bronze.t") == {"main": after, "audit_x": after}
    other.drop_table("bronze.t")
    assert not tables.exists("bronze.t")


def test_our_own_commit_is_known_without_reading_it_back(catalogs, file_reads):
    ours, _other = catalogs
    table = ours.create_table("bronze.t", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": [1, 2, 3]}))
    file_reads.clear()
    loaded = ours.load_table("bronze.t")
    assert file_reads == []
    assert loaded.metadata_location == table.metadata_location
    assert loaded.current_snapshot().summary["added-records"] == "3"


def test_refs_if_exists_answers_existence_and_refs_in_one_load(catalogs, monkeypatch):
    ours, other = catalogs
    tables = IcebergTables(spark=lambda: pytest.fail("no Spark for metadata questions"), catalog="lake",
                           meta_catalog=ours)
    assert tables.refs_if_exists("bronze.t") is None
    other.create_table("bronze.t", schema=pa.schema([("id", pa.int64())]))
    assert tables.refs_if_exists("bronze.t") == {}  # no snapshot yet: exists, no main
    other.load_table("bronze.t").append(pa.table({"id": [1]}))
    loads = []
    original = type(ours).load_table
    monkeypatch.setattr(type(ours), "load_table", lambda self, ident: loads.append(ident) or original(self, ident))
    assert tables.refs_if_exists("bronze.t") == {"main": other.load_table("bronze.t").current_snapshot().snapshot_id}
    assert loads == ["bronze.t"]


def test_an_availability_probe_reads_the_metadata_file_and_sees_it_gone(catalogs, tmp_path):
    """Recovery reroutes a stage when its upstream does not load (a storage outage: metadata files
    gone). The process's parsed copy would hide that, so the probe reads the file from storage."""
    import re
    import shutil
    from pathlib import Path
    from types import SimpleNamespace

    from lakehouse.sources.iceberg import probe_table

    ours, other = catalogs
    other.create_table("bronze.t", schema=pa.schema([("id", pa.int64())])).append(pa.table({"id": [1]}))
    platform = SimpleNamespace(pyiceberg_catalog=lambda: ours)
    assert probe_table(platform, "bronze.t") == (True, "table bronze.t loads")
    location = ours.load_table("bronze.t").metadata_location  # now held by the process
    shutil.move(str(Path(re.sub(r"^file:(//)?", "", location)).parent), str(tmp_path / "away"))
    ok, why = probe_table(platform, "bronze.t")
    assert not ok and why.startswith("table bronze.t does not load: ")
