"""Platform settings from the environment: embedded defaults, production by URL.

Secrets (database passwords, tokens) are only ever read from the environment by name and
are never part of `repr()`, logs or materialization metadata.
"""

from __future__ import annotations

import os
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


def load_settings() -> Settings:
    """Read settings now (not at import) so a test or a CLI flag can change the environment first."""
    home = Path(_env("LAKEHOUSE_HOME", str(Path.cwd() / ".lakehouse"))).resolve()
    warehouse = _env("LAKEHOUSE_WAREHOUSE", f"file://{home / 'warehouse'}")
    conf = {}
    for k, v in os.environ.items():
        # LAKEHOUSE_SPARK_CONF__spark.executor.memory=4g style pass-through
        if k.startswith("LAKEHOUSE_SPARK_CONF__"):
            conf[k[len("LAKEHOUSE_SPARK_CONF__") :]] = v
    return Settings(
        home=home,
        control_db_url=_env("LAKEHOUSE_CONTROL_DB_URL", f"sqlite:///{home / 'control.db'}"),
        catalog_name=_env("LAKEHOUSE_CATALOG_NAME", "lake"),
        catalog_uri=_env("LAKEHOUSE_CATALOG_URI", f"sqlite:///{home / 'catalog.db'}"),
        warehouse=warehouse,
        metadata_dir=Path(_env("LAKEHOUSE_METADATA_DIR", str(Path.cwd() / "metadata" / "demo"))),
        spark_master=_env("LAKEHOUSE_SPARK_MASTER", "local[*]"),
        spark_jars=_env("LAKEHOUSE_SPARK_JARS"),
        spark_packages=_env("LAKEHOUSE_SPARK_PACKAGES"),
        spark_conf=conf,
        s3_endpoint_url=_env("LAKEHOUSE_S3_ENDPOINT_URL"),
        datahub_gms_url=_env("DATAHUB_GMS_URL"),
    )
