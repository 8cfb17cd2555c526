"""Platform settings from the environment: embedded defaults, production by URL.

Secrets (database passwords, tokens) are only ever read from the environment by name and
are never part of `repr()`, logs or materialization metadata.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


@dataclass(frozen=True)
class Settings:
    home: Path
    control_db_url: str = field(repr=False)  # may carry a password: never in repr()
    catalog_name: str
    catalog_uri: str  # SQLAlchemy URL PyIceberg uses; the Spark JDBC URL is derived from it
    warehouse: str
    metadata_dir: Path
    spark_master: str
    spark_jars: str | None
    spark_packages: str | None
    spark_conf: dict[str, str] = field(default_factory=dict, repr=False)
    catalog_user_env: str = "LAKEHOUSE_CATALOG_USER"
    catalog_password_env: str = "LAKEHOUSE_CATALOG_PASSWORD"
    s3_endpoint_url: str | None = None
    datahub_gms_url: str | None = None
    datahub_token_env: str = "DATAHUB_GMS_TOKEN"

    @property
    def session_time_zone(self) -> str:
        """Spark's session time zone as lakehouse.spark.spark_conf sets it (UTC unless overridden):
        what runs without a session (DuckDB, the Arrow engine's expressions) evaluates timestamps in it."""
        return self.spark_conf.get("spark.sql.session.timeZone", "UTC")

    @property
    def staging_dir(self) -> Path:
        return Path(_env("LAKEHOUSE_STAGING_DIR", str(self.home / "staging")))

    @property
    def landing_dir(self) -> Path:
        return Path(_env("LAKEHOUSE_LANDING_DIR", str(self.home / "landing")))

    @property
    def warehouse_path(self) -> Path | None:
        if self.warehouse.startswith("file://"):
            return Path(self.warehouse[len("file://") :])
        if "://" not in self.warehouse:
            return Path(self.warehouse)
        return None

    @property
    def catalog_jdbc_url(self) -> str:
        """The Spark JdbcCatalog URL for the same database PyIceberg's SqlCatalog uses."""
        uri = self.catalog_uri
        if uri.startswith("sqlite:///"):
            return "jdbc:sqlite:" + uri[len("sqlite:///") :]
        if uri.startswith(("postgresql://", "postgresql+psycopg2://")):
            rest = uri.split("://", 1)[1]
            if "@" in rest:  # credentials come from the env vars, never from the URL
                rest = rest.split("@", 1)[1]
            return "jdbc:postgresql://" + rest
        raise ValueError(f"unsupported catalog URI scheme in {uri.split(':', 1)[0]!r}; use sqlite:/// or postgresql://")

    def catalog_credentials(self) -> tuple[str | None, str | None]:
        return os.environ.get(self.catalog_user_env), os.environ.get(self.catalog_password_env)


#: Each setting a deployment configures and the environment variable it is read from. The Dagster
#: layer's `LakehouseResource` has one field per entry (resources/lakehouse.py), so settings reach
#: Dagster through that one resource, and reach everything else (CLI, load service, tests) from the
#: environment, by the same names.
ENV_VARS: dict[str, str] = {
    "home": "LAKEHOUSE_HOME",
    "control_db_url": "LAKEHOUSE_CONTROL_DB_URL",
    "catalog_name": "LAKEHOUSE_CATALOG_NAME",
    "catalog_uri": "LAKEHOUSE_CATALOG_URI",
    "warehouse": "LAKEHOUSE_WAREHOUSE",
    "metadata_dir": "LAKEHOUSE_METADATA_DIR",
    "spark_master": "LAKEHOUSE_SPARK_MASTER",
    "spark_jars": "LAKEHOUSE_SPARK_JARS",
    "spark_packages": "LAKEHOUSE_SPARK_PACKAGES",
    "s3_endpoint_url": "LAKEHOUSE_S3_ENDPOINT_URL",
    "datahub_gms_url": "DATAHUB_GMS_URL",
}


def load_settings(overrides: Mapping[str, str | None] | None = None) -> Settings:
    """Read settings now (not at import) so a test or a CLI flag can change the environment first.

    `overrides`: values by setting name (`ENV_VARS`) that win over the environment; None or "" means
    "not set here" (the environment, then the embedded default, decides)."""
    given = {k: v for k, v in (overrides or {}).items() if v not in (None, "")}
    unknown = set(given) - set(ENV_VARS)
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(ENV_VARS)}")

    def get(name: str, default: str | None = None) -> str | None:
        return given[name] if name in given else _env(ENV_VARS[name], default)

    home = Path(get("home", str(Path.cwd() / ".lakehouse"))).resolve()
    warehouse = get("warehouse", f"file://{home / 'warehouse'}")
    conf = {}
    for k, v in os.environ.items():
        # LAKEHOUSE_SPARK_CONF__spark.executor.memory=4g style pass-through
        if k.startswith("LAKEHOUSE_SPARK_CONF__"):
            conf[k[len("LAKEHOUSE_SPARK_CONF__") :]] = v
    return Settings(
        home=home,
        control_db_url=get("control_db_url", f"sqlite:///{home / 'control.db'}"),
        catalog_name=get("catalog_name", "lake"),
        catalog_uri=get("catalog_uri", f"sqlite:///{home / 'catalog.db'}"),
        warehouse=warehouse,
        metadata_dir=Path(get("metadata_dir", str(Path.cwd() / "metadata" / "demo"))),
        spark_master=get("spark_master", "local[*]"),
        spark_jars=get("spark_jars"),
        spark_packages=get("spark_packages"),
        spark_conf=conf,
        s3_endpoint_url=get("s3_endpoint_url"),
        datahub_gms_url=get("datahub_gms_url"),
    )
