"""sources.dated_layout, path_columns, max_parallel_queries: seed 003's dated ingest and seed 004's
cap on concurrent partition queries (issue 43 items 3 and 4)

Revision ID: 9e4b2d7a1c63
Revises: 7d3a9c1e5b42
Create Date: 2026-11-29 05:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '9e4b2d7a1c63'
down_revision = '7d3a9c1e5b42'
branch_labels = None
depends_on = None

COLUMNS = (("dated_layout", sa.Text), ("path_columns", sa.Text), ("max_parallel_queries", sa.BigInteger))


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a model that already had the fields has them
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("sources")}
    with op.batch_alter_table("sources", schema=None) as batch_op:
        for name, typ in COLUMNS:
            if name not in have:
                batch_op.add_column(sa.Column(name, typ(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sources", schema=None) as batch_op:
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
