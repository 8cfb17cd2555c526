"""`Platform`: everything a stage needs from the outside world, built from settings.

Low in the package: settings, the control DB (metadata store), Spark, the Iceberg catalog and
the S3 clients, each built lazily on first use. Feature modules and the runner receive it;
it knows nothing of them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.metadata.store import MetadataStore
from lakehouse.runtime.s3access import S3Clients, s3_resource
from lakehouse.settings import Settings, load_settings
from lakehouse.table.iceberg import IcebergTables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("lakehouse.stage.runner")


@dataclass
class Platform:
    """Everything a stage needs from the outside world, built from settings.

    `s3_clients`: the S3 client provider (lakehouse.runtime.s3access); the Dagster layer injects one made
    from its `S3Resource`; otherwise `s3` makes one on first use from the same resource class
    configured by settings (importing dagster-aws only when S3 is used).
    """

    settings: Settings
    store: MetadataStore
    s3_clients: S3Clients | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from lakehouse.runtime.fileperms import apply_umask

        apply_umask(self.settings.umask)  # what the platform creates is owner-only (LAKEHOUSE_UMASK)
        from lakehouse.metadata.python_ref import search_in

        search_in(self.settings.metadata_dir)  # Python transformation modules live next to the metadata

    @property
    def s3(self) -> S3Clients:
        if self.s3_clients is None:
            self.s3_clients = S3Clients.from_resource(s3_resource(self.settings))
        return self.s3_clients

    @classmethod
    def from_settings(cls, settings: Settings, s3_clients: S3Clients | None = None) -> Platform:
        return cls(settings, MetadataStore(settings.control_db_url), s3_clients)

    @classmethod
    def from_env(cls, s3_clients: S3Clients | None = None) -> Platform:
        """For entry points only (the CLI, the load service, tests): the Dagster layer builds its
        platform from `LakehouseResource` (resources/lakehouse.py), the domain receives one."""
        return cls.from_settings(load_settings(), s3_clients)

    def spark(self) -> SparkSession:
        from lakehouse.runtime.spark import get_spark

        return get_spark(self.settings)

    def warm_spark(self) -> threading.Thread:
        """Start the process's SparkSession and its Iceberg catalog in the background (a cold JVM
        takes seconds); the first `spark()` call waits for the session. A failure here is left
        for that call to raise. PySpark (and py4j) is imported on the calling thread first: the
        caller goes on importing (Dagster) while the session starts, and two threads importing one
        package at once can see it partially initialised."""
        from lakehouse.runtime.spark import warm_up, while_starting

        thread = warm_up(self.settings)  # the one `lakehouse run` launched before its imports, if any
        if self.settings.warehouse_path is None:
            # a remote warehouse's metadata is read with PyIceberg's pyarrow FileIO (pyarrow.dataset,
            # pandas: ~0.3 s of CPU): imported by the step that waits for the JVM while it waits
            # (lakehouse.runtime.spark.while_starting). A local one's is read with plain files
            # (lakehouse.table.fileio): a Spark run's driver then never imports it
            while_starting(_import_file_io)
        return thread

    def tables(self) -> IcebergTables:
        # Spark is started on first use only: planning and skipping read metadata with PyIceberg
        return IcebergTables(self.spark, self.settings.catalog_name, self.pyiceberg_catalog())

    def pyiceberg_catalog(self):
        """PyIceberg view of the same catalog (same name, same database): metadata reads without Spark."""
        from lakehouse.table.catalog import pyiceberg_catalog

        return pyiceberg_catalog(self.settings)

    def catalog(self) -> MetadataCatalog:
        return self.store.load()


def _import_file_io() -> None:
    import pyiceberg.io.pyarrow  # noqa: F401
