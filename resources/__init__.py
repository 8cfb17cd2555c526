"""Dagster resources: the platform (control DB + settings), Spark, and the Iceberg IO manager."""

from resources.io_manager import IcebergIOManager, StageWrite
from resources.lakehouse import LakehouseResource
from resources.spark import LakehouseSparkResource, spark_resource

__all__ = ["IcebergIOManager", "LakehouseResource", "LakehouseSparkResource", "StageWrite", "spark_resource"]
