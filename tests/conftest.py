"""Shared fixtures: one SparkSession for the whole test session, and an isolated platform home.

The Spark session is bound to one Iceberg catalog (a SQLite file under a session temp dir);
each test gets its own namespace-safe home for the control DB, landing zone and staging.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from lakehouse.settings import load_settings

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def lake_home(tmp_path_factory) -> Path:
    """The home whose catalog.db / warehouse the session's SparkSession is bound to."""
    home = tmp_path_factory.mktemp("lakehouse")
    os.environ["LAKEHOUSE_HOME"] = str(home)
    os.environ.setdefault("LAKEHOUSE_SHUFFLE_PARTITIONS", "2")
    os.environ.setdefault("LAKEHOUSE_SPARK_MASTER", "local[2]")
    os.environ["DAGSTER_HOME"] = str(home / "dagster_home")
    (home / "dagster_home").mkdir(exist_ok=True)
    return home


@pytest.fixture(scope="session")
def spark(lake_home):
    from lakehouse.spark import get_spark

    session = get_spark(load_settings(), app_name="lakehouse-tests")
    yield session
    session.stop()


@pytest.fixture
def settings(lake_home, tmp_path, monkeypatch):
    """Settings for one test: the shared catalog/warehouse, but a fresh control DB and landing zone."""
    monkeypatch.setenv("LAKEHOUSE_CONTROL_DB_URL", f"sqlite:///{tmp_path / 'control.db'}")
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", f"sqlite:///{lake_home / 'catalog.db'}")
    monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", f"file://{lake_home / 'warehouse'}")
    monkeypatch.setenv("LAKEHOUSE_STAGING_DIR", str(tmp_path / "staging"))
    monkeypatch.setenv("LAKEHOUSE_LANDING_DIR", str(tmp_path / "landing"))
    return load_settings()


@pytest.fixture
def unique_ns() -> str:
    """A fresh Iceberg namespace suffix so tests sharing the session catalog never collide."""
    return "t" + uuid.uuid4().hex[:8]
