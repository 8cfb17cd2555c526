"""dagster-pyspark's lazy PySpark resource whose session is the platform's process-wide one.

Imported only when a step asks `resources.spark.LakehouseSparkResource` for a session: this module
imports dagster-pyspark and pyspark (no JVM until the session is built).
"""

from __future__ import annotations

from typing import Any

from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.runtime.spark import get_spark
from lakehouse.settings import Settings, load_settings
from resources.lakehouse import LakehouseResource


class PlatformPySparkResource(LazyPySparkResource):
    """Why a subclass and not `PySparkResource` as is: that resource builds its session eagerly when a
    step's resources are set up, from its `spark_config` alone. Here a step must not start a JVM
    it does not need, the session must be `lakehouse.runtime.spark`'s one per process (healing restarts it
    there; every asset of the run shares it), and it needs what no Dagster config may hold or do:
    the catalog password (resolved from the environment, never shown in the UI), the local Spark
    directories and the SQLite catalog's connection pool. So the session is built on first use, by
    `lakehouse.runtime.spark.get_spark` from `lakehouse`'s settings."""

    lakehouse: LakehouseResource | None = None

    def _settings(self) -> Settings:
        return self.lakehouse.settings() if self.lakehouse is not None else load_settings()

    # the session this resource handed out (the parent's own cache and its `_init_session` are
    # dagster-pyspark's internals: this subclass overrides only the public properties)
    _session: Any = PrivateAttr(default=None)

    @property
    def spark_session(self) -> Any:
        if pyspark_compat.is_stopped(self._session):
            self._session = get_spark(self._settings())
        else:  # the calling thread may not be the one that got it (lakehouse.compat.pyspark.make_active)
            pyspark_compat.make_active(self._session)
        return self._session

    @property
    def spark_context(self) -> Any:
        return self.spark_session.sparkContext
