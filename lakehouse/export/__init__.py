"""Exports of published Iceberg tables to outside systems (the warehouse: Redshift / PostgreSQL)."""
