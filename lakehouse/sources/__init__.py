"""Source adapters: one per kind of input, found by kind (see `lakehouse.sources.base`).

`adapter_for(kind)` is the one lookup the rest of the platform uses. A built-in kind's module is
imported when its adapter is first asked for (as PyIceberg loads a FileIO by scheme): a run of a
files stage never imports the JDBC, SQL (sqlglot) or Python adapters and what they pull in.
"""

from lakehouse.sources.base import SourceAdapter, register, registered_adapter, registered_kinds

adapter_for = registered_adapter
kinds = registered_kinds

__all__ = ["SourceAdapter", "adapter_for", "kinds", "register"]
