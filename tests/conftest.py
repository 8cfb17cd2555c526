"""Shared fixtures: one SparkSession for the whole test session, and an isolated platform home.

The Spark session is bound to one Iceberg catalog (a SQLite file under a session temp dir);
each test gets its own namespace-safe home for the control DB, landing zone and staging.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import uuid
from pathlib import Path

import pytest

from lakehouse.settings import load_settings
from tests import jvm_class_archive

REPO = Path(__file__).resolve().parent.parent

# Test JVMs live for seconds and see tiny data: C2's background compilation was half of each JVM's
# CPU on the 2-core CI machine (a session start, six appends and a MERGE: 52 s of JVM CPU by
# default, 25 s with C1 alone), and every `lakehouse run` a test starts is a new JVM. What the JVM
# computes is the same either way; the platform's own settings (lakehouse.runtime.spark.spark_conf) and the
# benchmarks are untouched. Set in the environment so the test's subprocesses inherit it.
_TEST_JVM_OPTIONS = jvm_class_archive.TEST_JVM_OPTIONS
os.environ.setdefault("LAKEHOUSE_SPARK_CONF__spark.driver.extraJavaOptions",
                      f"-Dderby.system.home=/tmp {_TEST_JVM_OPTIONS}")  # the first: lakehouse.runtime.spark's own
os.environ.setdefault("LAKEHOUSE_SPARK_CONF__spark.executor.extraJavaOptions", _TEST_JVM_OPTIONS)
# ... and their classes come from a class-data-sharing archive, built before the first slow test
# (tests/jvm_class_archive.py): about half of a short JVM's CPU was loading Spark's classes.
jvm_class_archive.use(_TEST_JVM_OPTIONS)

# Every module in tests/fixtures/ is a fixture plugin (services: PostgreSQL, moto S3, DataHub GMS...).
pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}" for p in (Path(__file__).parent / "fixtures").glob("*.py") if p.stem != "__init__"
)


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
    from lakehouse.runtime.spark import get_spark

    session = get_spark(load_settings(), app_name="lakehouse-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def control_db_at_head(tmp_path_factory) -> Path:
    """An embedded control DB migrated to the newest revision once per session, by the platform's own
    first use (Alembic: every revision in order). Tests start from a copy of it (`seed_control_db`):
    migrating a fresh file loads and runs the ten revisions again, ~0.1 s, and the fast lane did it
    for over a hundred tests. Migrations themselves are tested on fresh databases in
    tests/test_control_schema.py, tests/test_metadata.py and tests/test_concurrent_first_start.py."""
    import sqlalchemy as sa

    from lakehouse.metadata import migrate

    path = tmp_path_factory.mktemp("control_db_at_head") / "control.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    migrate.upgrade(engine)
    migrate.forget(engine)
    engine.dispose()
    with contextlib.closing(sqlite3.connect(path)) as conn:  # all of it in the file itself, none in a -wal
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def seed_control_db(template: Path, home: Path) -> None:
    """`home`/control.db as a copy of the session's control DB at head (its mode too: owner-only)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, home / "control.db")


@pytest.fixture
def settings(lake_home, tmp_path, monkeypatch, control_db_at_head):
    """Settings for one test: its own home, control DB (at the newest revision), Iceberg catalog (a
    new catalog name registered at run time on the shared SparkSession), warehouse, landing zone and
    staging."""
    seed_control_db(control_db_at_head, tmp_path)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.setenv("LAKEHOUSE_CONTROL_DB_URL", f"sqlite:///{tmp_path / 'control.db'}")
    monkeypatch.setenv("LAKEHOUSE_CATALOG_NAME", "lake_" + uuid.uuid4().hex[:10])
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", f"sqlite:///{tmp_path / 'catalog.db'}")
    monkeypatch.setenv("LAKEHOUSE_WAREHOUSE", f"file://{tmp_path / 'warehouse'}")
    monkeypatch.delenv("LAKEHOUSE_STAGING_DIR", raising=False)
    monkeypatch.delenv("LAKEHOUSE_LANDING_DIR", raising=False)
    return load_settings()


@pytest.fixture
def platform(settings, spark):
    """A Platform on the test's settings, with the session's SparkSession bound to its catalog."""
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.stage.runner import Platform

    p = Platform(settings, MetadataStore(settings.control_db_url))
    p.spark()  # registers the test's catalog on the shared session
    return p


@pytest.fixture
def unique_ns() -> str:
    """A fresh Iceberg namespace suffix so tests sharing the session catalog never collide."""
    return "t" + uuid.uuid4().hex[:8]


#: Fixtures that start a JVM or a whole Dagster deployment: a test using one (even through another
#: fixture) is slow by definition.
SLOW_FIXTURES = frozenset({"spark", "dagster_daemon_factory", "dagster_daemon", "dagster_dev", "browser"})


#: The slow lane's longest modules, longest first (their tests' summed times in CI, 2026-11-26: 300-550 s
#: each down to ~100 s). The slow lane hands whole modules to two workers in collection order, so a
#: long module collected last (test_ui) ran alone at the end while the other worker idled; started
#: first, the short modules fill in behind them.
LONGEST_MODULES = ("test_concurrent_runs", "test_load_service", "test_ui", "test_branch_hygiene", "test_incremental",
                   "test_arrow_engine_spark", "test_outage", "test_checkpoint_crash", "test_pools",
                   "test_killswitch_daemon")


def pytest_collection_modifyitems(config, items):
    """Mark the tests that need Spark or a running Dagster slow, so the fast lane (`pytest -m "not
    slow"`) stays free of them without anyone having to remember a marker; then the longest modules
    first (a stable sort: every module keeps its own order)."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {name: n for n, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(Path(item.nodeid.partition("::")[0]).stem, len(rank)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the first slow test of this process starts a JVM (its fixtures' or its subprocesses'):
    the class archive, built once for every worker (tests/jvm_class_archive.py)."""
    if item.get_closest_marker("slow") is not None and not _ARCHIVE_READY:
        if jvm_class_archive.ensure(_TEST_JVM_OPTIONS):  # False: another worker is building it
            _ARCHIVE_READY.append(True)


_ARCHIVE_READY: list[bool] = []


@pytest.fixture(autouse=True)
def _fast_tests_start_no_jvm(request, monkeypatch):
    """In a test not marked slow, starting a JVM in this process fails the test by name: the fast
    lane's promise (no Spark) is checked, not hoped for. A subprocess that starts one (`lakehouse
    run`, `dagster dev`) must be marked slow by hand."""
    if request.node.get_closest_marker("slow") is not None:
        return
    import pyspark.context

    def refuse(*_args, **_kwargs):
        pytest.fail(f"{request.node.nodeid} starts a JVM but is not marked slow: take the `spark` fixture or "
                    "mark it @pytest.mark.slow (the fast lane runs without Spark)", pytrace=False)

    monkeypatch.setattr(pyspark.context, "launch_gateway", refuse)
