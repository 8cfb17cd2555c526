"""Alembic environment of the control DB: always called with a live connection by
lakehouse.metadata.migrate (there is no alembic.ini and no offline SQL mode)."""

from __future__ import annotations

from alembic import context

from lakehouse.metadata.schema import metadata_obj

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata_obj,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
