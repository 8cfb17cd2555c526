"""Iceberg tables and their catalog: access (`iceberg`, `catalog`, `fileio`, `sqlite_files`), branches, publish and maintenance."""
