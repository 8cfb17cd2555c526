"""lakehouse/compat/pyspark.py reaches PySpark's Py4J internals: it is written for the PySpark releases
it names, and this test fails on any other (check the shim against the new release, then widen
`WRITTEN_FOR` and the pin). Its functions run in every Spark test (maintenance, branch sweeps, rules,
pruning, the JDBC probe); the ones that need no JVM are checked here."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from packaging.specifiers import SpecifierSet

from lakehouse.compat import pyspark as pyspark_compat


def test_the_installed_pyspark_is_one_the_shim_was_written_for():
    for dist, spec in pyspark_compat.WRITTEN_FOR.items():
        installed = version(dist)
        assert installed in SpecifierSet(spec), (
            f"{dist} {installed} is installed; lakehouse/compat/pyspark.py was written for {dist}{spec}")


def test_without_a_session_nothing_is_running_and_none_is_started():
    if pyspark_compat.context_active():
        pytest.skip("a SparkContext of another test is running in this process")
    assert pyspark_compat.is_stopped(None)
    assert not pyspark_compat.context_active()


def test_a_java_call_on_another_thread_finds_a_catalog_not_loaded_yet(spark, tmp_path):
    """Spark looks a catalog's conf up through the calling thread's active session: a Py4J call on a
    thread where none is active read a blank conf, in which no catalog is defined, whenever the
    catalog had not been loaded yet (a first run's catalog whose database was down while the
    session warmed up on another thread; issue 40). Through the shim, that thread finds it."""
    import threading
    import uuid

    name = "thread_cat_" + uuid.uuid4().hex[:8]
    conf = {f"spark.sql.catalog.{name}": "org.apache.iceberg.spark.SparkCatalog",
            f"spark.sql.catalog.{name}.type": "hadoop", f"spark.sql.catalog.{name}.warehouse": f"file://{tmp_path}"}
    for k, v in conf.items():
        spark.conf.set(k, v)  # registered, never loaded
    got: dict[str, str] = {}

    def other() -> None:
        try:
            got["name"] = pyspark_compat.java_session(spark).sessionState().catalogManager().catalog(name).name()
        except Exception as exc:  # noqa: BLE001 - reported below
            got["error"] = str(exc).splitlines()[0]

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert got == {"name": name}
