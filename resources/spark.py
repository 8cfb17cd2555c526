"""Spark for Dagster via dagster-pyspark, configured for the Iceberg catalog the platform shares."""

from __future__ import annotations

from dagster_pyspark import PySparkResource

from lakehouse.settings import Settings, load_settings
from lakehouse.spark import spark_conf


def spark_resource(settings: Settings | None = None) -> PySparkResource:
    """A PySparkResource whose session is the process-wide one `lakehouse.spark.get_spark` reuses.

    The catalog password (if any) is part of the Spark conf only, never of Dagster config shown in
    the UI: it is resolved from the environment when the session is built. `settings`: the code
    location's (`LakehouseResource.settings()`); the environment's when not given.
    """
    conf = {k: v for k, v in spark_conf(settings or load_settings()).items() if "password" not in k}
    return PySparkResource(spark_config=conf)
