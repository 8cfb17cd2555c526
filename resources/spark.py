"""Spark for Dagster via dagster-pyspark, configured for the Iceberg catalog the platform shares."""

from __future__ import annotations

from typing import Any

from dagster_pyspark import LazyPySparkResource

from lakehouse.settings import Settings, load_settings
from lakehouse.spark import get_spark, spark_conf
from resources.lakehouse import LakehouseResource


class LakehouseSparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy PySpark resource whose session is the platform's process-wide one.

    Why a subclass and not `PySparkResource` as is: that resource builds its session eagerly when a
    step's resources are set up, from its `spark_config` alone. Here a step must not start a JVM
    it does not need (a load skipped by a kill switch, an entity_raw table check, the dashboard),
    the session must be `lakehouse.spark`'s one per process (healing restarts it there; every
    asset of the run shares it), and it needs what no Dagster config may hold or do: the catalog
    password (resolved from the environment, never shown in the UI), the local Spark directories
    and the SQLite catalog's connection pool. So the session is built on first use, by
    `lakehouse.spark.get_spark` from `lakehouse`'s settings; `spark_config` is what the UI shows
    (the same conf, no secrets).
    """

    lakehouse: LakehouseResource | None = None  # None: the environment's settings (as the CLI)

    def _settings(self) -> Settings:
        return self.lakehouse.settings() if self.lakehouse is not None else load_settings()

    def _init_session(self) -> None:
        if self._spark_session is None or self._spark_session.sparkContext._jsc is None:
            self._spark_session = get_spark(self._settings())

    @property
    def spark_session(self) -> Any:
        self._init_session()
        return self._spark_session


def spark_resource(lakehouse: LakehouseResource | None = None) -> LakehouseSparkResource:
    """The Spark resource of the code location, built from `lakehouse`'s settings (the
    environment's when not given); its displayed conf carries no password."""
    settings = lakehouse.settings() if lakehouse is not None else load_settings()
    conf = {k: v for k, v in spark_conf(settings).items() if "password" not in k}
    return LakehouseSparkResource(spark_config=conf, lakehouse=lakehouse)
