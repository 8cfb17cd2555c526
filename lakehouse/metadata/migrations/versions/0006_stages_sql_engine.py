"""stages.sql_engine: a SQL stage may run its SELECT on DuckDB (lakehouse.sources.duckdb_sql, issue 21)

Revision ID: 7c3d9e1f2a60
Revises: dbefa67f8e56
Create Date: 2026-11-23 23:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '7c3d9e1f2a60'
down_revision = 'dbefa67f8e56'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a model that already had the field has it
    if "sql_engine" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("stages")}:
        return
    with op.batch_alter_table("stages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sql_engine", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stages", schema=None) as batch_op:
        batch_op.drop_column("sql_engine")
