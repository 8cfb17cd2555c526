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
