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

from lakehouse.runtime.spark import configure_session, shown_conf
from lakehouse.settings import load_settings
from resources.lakehouse import LakehouseResource


class LakehouseSparkResource(dg.ConfigurableResource):
    """The code location's Spark: dagster-pyspark's lazy resource whose session is the platform's
    process-wide one, imported and built on first use.

    Why not dagster-pyspark's resource as the resource itself: its class imports pyspark, so every
    process that loads the code location would, Arrow runs included. This resource has the same
    config (`spark_config`, what the UI shows: the session's conf without credentials) and hands the
    session out through `resources.pyspark_session.PlatformPySparkResource`, a `LazyPySparkResource`.

    `spark_config` is the conf the run's session is built from (`lakehouse.runtime.spark.configure_session`
    as the run's resources are set up, before the JVM's warm-up), whoever asks for the session first
    (a step's `platform.spark()`, the IO manager, the warm-up): the default is the conf the settings
    give (`lakehouse.runtime.spark.shown_conf`), a run's config may change it, and the credentials (the
    catalog's user and password) come from the settings, never from configuration.
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

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        configure_session(self.spark_config)
        (self.lakehouse if self.lakehouse is not None else LakehouseResource()).warm_up_for_run(context.dagster_run)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        configure_session(None)

    @property
    def spark_session(self) -> Any:
        return self.pyspark_resource().spark_session

    @property
    def spark_context(self) -> Any:
        return self.spark_session.sparkContext


def spark_resource(lakehouse: LakehouseResource | None = None) -> LakehouseSparkResource:
    """The Spark resource of the code location, built from `lakehouse`'s settings (the
    environment's when not given); its displayed conf carries no credential."""
    settings = lakehouse.settings() if lakehouse is not None else load_settings()
    return LakehouseSparkResource(spark_config=shown_conf(settings), lakehouse=lakehouse)
