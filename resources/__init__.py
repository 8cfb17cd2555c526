"""Dagster resources: the platform (control DB + settings), Spark, and the Iceberg IO manager."""

from resources.io_manager import IcebergIOManager, PublishedTable
from resources.lakehouse import LakehouseResource
from resources.spark import spark_resource

__all__ = ["IcebergIOManager", "LakehouseResource", "PublishedTable", "spark_resource"]
