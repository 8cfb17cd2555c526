"""Spark SQL identifier quoting and string literals, with no imports: the one place SQL text gets a
name or a value from metadata or data (lakehouse.table.iceberg re-exports both; lakehouse.runtime.spark uses them
while the main thread may still be importing the metadata model)."""

from __future__ import annotations


def quote(name: str) -> str:
    """Spark SQL identifier quoting: `name` with embedded backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
