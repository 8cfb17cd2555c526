"""Source adapters: one per kind of input, found by kind (see `lakehouse.sources.base`).

Importing this package registers every built-in kind; `adapter_for(kind)` is the one lookup the
rest of the platform uses.
"""

from lakehouse.sources import entity_raw, files, iceberg, jdbc, python, s3, sql  # noqa: F401 - registers the kinds
from lakehouse.sources.base import SourceAdapter, register, registered_adapter, registered_kinds

adapter_for = registered_adapter
kinds = registered_kinds

__all__ = ["SourceAdapter", "adapter_for", "kinds", "register"]
