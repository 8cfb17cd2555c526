"""The platform resource: the one way settings reach Dagster, and the `Platform` built from them."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from lakehouse.platform import Platform
from lakehouse.runtime.s3access import S3Clients
from lakehouse.settings import ENV_VARS, PlatformSettings, load_settings, set_in_environment

_UNSET = "Unset: the environment variable of the same setting (lakehouse.settings.ENV_VARS), else the embedded default."


class LakehouseResource(dg.ConfigurableResource):
    """The platform's settings as Dagster configuration, and the `Platform` every asset, check,
    sensor, schedule and the IO manager gets from `platform()`.

    One field per deployment setting (`lakehouse.settings.ENV_VARS`). A field left unset is read
    from the environment when the platform is built, as the CLI reads it, together with every other
    field of `lakehouse.settings.PlatformSettings`. The code location configures every
    setting its environment sets as a `dg.EnvVar` (`from_settings`), so the UI's resource page shows
    the variable's name, never its value: the control DB URL may carry a password, and the S3 and
    catalog credentials stay in the environment altogether (boto3's chain,
    `LAKEHOUSE_CATALOG_USER`/`_PASSWORD`), never in configuration.

    Nothing is cached on the resource: each step re-reads the control DB, which is what lets a
    metadata update (a flag, a throttle, a rule) apply without a code-location reload. Every S3
    client the step's domain code uses comes from `s3` (endpoint and region are configuration).
    """

    home: str | None = Field(default=None, description=f"Platform home (LAKEHOUSE_HOME). {_UNSET}")
    control_db_url: str | None = Field(default=None, description="Control DB SQLAlchemy URL; may carry a "
                                       f"password: configure it as an EnvVar. {_UNSET}")
    catalog_name: str | None = Field(default=None, description=f"Iceberg catalog name. {_UNSET}")
    catalog_uri: str | None = Field(default=None, description=f"Iceberg SQL catalog URL. {_UNSET}")
    warehouse: str | None = Field(default=None, description=f"Iceberg warehouse location. {_UNSET}")
    metadata_dir: str | None = Field(default=None, description=f"Metadata folder. {_UNSET}")
    spark_master: str | None = Field(default=None, description=f"Spark master. {_UNSET}")
    spark_jars: str | None = Field(default=None, description=f"spark.jars. {_UNSET}")
    spark_packages: str | None = Field(default=None, description=f"spark.jars.packages. {_UNSET}")
    s3_endpoint_url: str | None = Field(default=None, description=f"S3 endpoint for the platform. {_UNSET}")
    datahub_gms_url: str | None = Field(default=None, description=f"DataHub GMS URL. {_UNSET}")
    # dagster-aws's S3Resource. Typed as any resource so that importing the code location does not
    # import dagster-aws (its package imports Dagster's components and test utilities: ~1.4 s of CPU
    # in every process that loads the definitions, a run worker's included). None: the platform makes
    # the same S3Resource from settings when a step first needs S3 (lakehouse.runtime.s3access.s3_resource).
    s3: dg.ConfigurableResource | None = None

    @classmethod
    def from_settings(cls) -> LakehouseResource:
        """The resource as the code location configures it: each setting the environment sets, as
        an `EnvVar` (resolved by Dagster in the process that runs the step); S3 from settings, made
        when first used."""
        return cls(**{name: dg.EnvVar(var) for name, var in set_in_environment(ENV_VARS).items()})

    def settings(self) -> PlatformSettings:
        """Settings from this resource's fields, the environment filling what they leave unset.

        Inside a run Dagster has resolved every `EnvVar` field; the code location's own build (which
        uses the resource before any run) resolves them here, the same way."""
        return load_settings({name: _resolved(getattr(self, name)) for name in ENV_VARS})

    def platform(self) -> Platform:
        return Platform.from_settings(self.settings(),
                                      S3Clients.from_resource(self.s3) if self.s3 is not None else None)

    def warm_up_for_run(self, run: dg.DagsterRun | None) -> None:
        """A run the UI, a sensor or a schedule launched starts its JVM here (called by the PySpark
        resource's set-up, `resources.spark`, once the Spark conf the run uses is known), once per
        run before its first step, when a selected stage may need Spark
        (`lakehouse.engines.choice.stages_may_need_spark`): the JVM then starts on the other core while
        Dagster sets the steps up and an Arrow load runs, as `lakehouse run` launches its own before
        its imports (lakehouse_assets/cli.py). A run of Arrow-only stages starts none;
        LAKEHOUSE_SPARK_WARMUP=0 leaves the start to the first step that asks for the session."""
        if run is None or not run.asset_selection or not self.settings().spark_warmup:
            return
        from lakehouse.engines.choice import stages_may_need_spark
        from lakehouse.runtime.spark import started_or_starting

        if started_or_starting():
            return
        from lakehouse.metadata.assets import stage_paths  # [layer, table]: what a stage's asset key is

        platform = self.platform()
        catalog = platform.store.load(["stages", "targets", "sources", "validation_rules", "platform_settings"])
        wanted = {stage_paths(catalog).get(tuple(key.path)) for key in run.asset_selection}
        selected = [s for s in catalog.stages if (s.pipeline_id, s.stage_name) in wanted]
        if stages_may_need_spark(catalog, selected):
            platform.warm_spark()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        """A JVM the warm-up is still starting when the run ends (its Spark stages were skipped:
        switched off, nothing new) is killed rather than left to finish starting on the cores other
        runs use (`lakehouse.runtime.spark.release_jvm_at_exit`); a session, or a JVM no warm-up started, is
        left alone."""
        from lakehouse.runtime import spark

        if context.dagster_run is not None and spark.starting():
            spark.release_jvm_at_exit()


def _resolved(value: str | None) -> str | None:
    return value.get_value() if isinstance(value, dg.EnvVar) else value
