"""Spark for Dagster via dagster-pyspark, configured for the Iceberg catalog the platform shares.

Neither this module nor the resource's setup imports pyspark or dagster-pyspark: a code server's
import, an Arrow run and a step that needs no Spark (a load skipped by a kill switch, an entity_raw
table check, the dashboard) never pay for them (issue 21: ~0.3 s of CPU per `lakehouse run`).
dagster-pyspark's resource, and pyspark with it, is imported when a session is first asked for.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from lakehouse.settings import load_settings
from lakehouse.spark import spark_conf
from resources.lakehouse import LakehouseResource


class LakehouseSparkResource(dg.ConfigurableResource):
    """The code location's Spark: dagster-pyspark's lazy resource whose session is the platform's
    process-wide one, imported and built on first use.

    Why not dagster-pyspark's resource as the resource itself: its class imports pyspark, so every
    process that loads the code location would, Arrow runs included. This resource has the same
    config (`spark_config`, what the UI shows: the session's conf without secrets) and hands the
    session out through `resources.pyspark_session.PlatformPySparkResource`, a `LazyPySparkResource`.
    """

    spark_config: dict[str, Any]
    lakehouse: LakehouseResource | None = None  # None: the environment's settings (as the CLI)
    _delegate: Any = PrivateAttr(default=None)

    def pyspark_resource(self) -> Any:
        """dagster-pyspark's resource behind this one (imports pyspark; starts no JVM by itself)."""
        if self._delegate is None:
            from resources.pyspark_session import PlatformPySparkResource

            self._delegate = PlatformPySparkResource(spark_config=self.spark_config, lakehouse=self.lakehouse)
        return self._delegate

    @property
    def spark_session(self) -> Any:
        return self.pyspark_resource().spark_session

    @property
    def spark_context(self) -> Any:
        return self.spark_session.sparkContext


def spark_resource(lakehouse: LakehouseResource | None = None) -> LakehouseSparkResource:
    """The Spark resource of the code location, built from `lakehouse`'s settings (the
    environment's when not given); its displayed conf carries no password."""
    settings = lakehouse.settings() if lakehouse is not None else load_settings()
    conf = {k: v for k, v in spark_conf(settings).items() if "password" not in k}
    return LakehouseSparkResource(spark_config=conf, lakehouse=lakehouse)
