"""Lineage: column lineage from SQL, `sql import`, the recovery-route graph, health probes, DataHub."""
