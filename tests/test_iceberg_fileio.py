"""The platform's PyIceberg FileIO (lakehouse.table.fileio): a local warehouse's metadata through
plain files, data files and remote locations through PyArrow's FileIO. What a Spark run's driver
does with PyIceberg — load tables, read snapshots and manifests, commit a property — imports
neither pyarrow.dataset nor pandas (issue 21: ~0.3 s of CPU per Spark run); the Arrow engine's reads and
writes of data files still go through PyArrow's native streams."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse.settings import load_settings
from lakehouse.table.catalog import pyiceberg_catalog
from lakehouse.table.fileio import LocalFile, LocalMetadataFileIO, local_path

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME", "LAKEHOUSE_CONTROL_DB_URL"):
        monkeypatch.delenv(var, raising=False)
    return load_settings()


def test_metadata_reads_and_commits_import_neither_pyarrow_dataset_nor_pandas(settings, tmp_path):
    cat = pyiceberg_catalog(settings)
    cat.create_namespace("bronze")
    table = cat.create_table("bronze.events", schema=pa.schema([("id", pa.int64()), ("s", pa.string())]))
    table.append(pa.table({"id": [1, 2, 3], "s": ["a", None, "c"]}))
    table.append(pa.table({"id": [4], "s": ["d"]}))
    assert isinstance(table.io, LocalMetadataFileIO)
    # a fresh process, as a Spark run's driver: metadata only, then a commit of a property
    code = textwrap.dedent("""
        import json, sys
        from lakehouse.table.catalog import pyiceberg_catalog
        from lakehouse.settings import load_settings
        cat = pyiceberg_catalog(load_settings())
        table = cat.load_table("bronze.events")
        snap = table.current_snapshot()
        files = sorted(e.data_file.file_path for m in snap.manifests(table.io) for e in m.fetch_manifest_entry(table.io))
        with table.transaction() as tx:
            tx.set_properties({"lakehouse.test": "yes"})
        again = cat.load_table_from_storage("bronze.events")
        print(json.dumps({"files": files, "snapshots": len(again.metadata.snapshots),
                          "prop": again.properties.get("lakehouse.test"),
                          "loaded": sorted(m for m in ("pyarrow.dataset", "pandas", "pyiceberg.io.pyarrow")
                                           if m in sys.modules)}))
    """)
    env = {**os.environ, "LAKEHOUSE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(seen["files"]) == 2 and all(f.endswith(".parquet") for f in seen["files"])
    assert seen["snapshots"] == 2 and seen["prop"] == "yes"
    assert seen["loaded"] == [], f"a metadata-only PyIceberg user imported {seen['loaded']}"
    # the data is intact, read back through PyArrow's FileIO, with the property committed by the child
    back = cat.load_table("bronze.events")
    assert back.properties["lakehouse.test"] == "yes"
    assert sorted(back.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]


def test_data_files_and_remote_locations_go_through_pyarrow(settings, tmp_path):
    from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

    io = LocalMetadataFileIO({"s3.endpoint": "http://localhost:1"})
    assert isinstance(io.new_input(f"file://{tmp_path}/t/data/a.parquet"), PyArrowFile)
    assert isinstance(io.new_output(f"{tmp_path}/t/data/b.PARQUET"), PyArrowFile)
    assert isinstance(io.new_input(f"file://{tmp_path}/t/metadata/snap-1.avro"), LocalFile)
    assert isinstance(io.arrow(), PyArrowFileIO) and io.arrow().properties["s3.endpoint"] == "http://localhost:1"
    assert local_path("s3://bucket/t/metadata/v1.metadata.json") is None
    assert local_path("file://host/x.json") is None  # a host: not a local path (PyArrow would refuse it too)
    assert local_path("file:/tmp/x/y.avro") == "/tmp/x/y.avro"  # as Spark writes locations
    assert local_path("rel/y.json") == os.path.abspath("rel/y.json")


def test_local_files_behave_as_pyiceberg_expects(tmp_path):
    io = LocalMetadataFileIO()
    where = f"file://{tmp_path}/t/metadata/00001.metadata.json"
    out = io.new_output(where)
    assert not out.exists()
    with out.create() as f:  # parent directories are created, as PyIceberg's local file system does
        f.write(b'{"a": 1}')
    with pytest.raises(FileExistsError, match="already exists"):
        out.create()
    with out.create(overwrite=True) as f:
        f.write(b'{"a": 2}')
    inp = io.new_input(where)
    assert inp.exists() and len(inp) == 8
    with inp.open() as f:
        assert json.loads(f.read()) == {"a": 2}
    io.delete(inp)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        io.delete(where)
    with pytest.raises(FileNotFoundError):
        io.new_input(where).open()
    import pickle

    again = pickle.loads(pickle.dumps(LocalMetadataFileIO({"k": "v"})))
    assert isinstance(again, LocalMetadataFileIO) and again.properties == {"k": "v"}
