"""Dagster-facing layer: assets, checks and jobs generated from the metadata catalog."""
