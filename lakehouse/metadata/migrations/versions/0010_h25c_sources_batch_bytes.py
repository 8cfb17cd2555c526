"""sources.batch_bytes: file batches bounded by bytes as well as by files (issue 21)

Revision ID: c4e81a6f2d30
Revises: 5b2d9e4c7a19
Create Date: 2026-11-26 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = 'c4e81a6f2d30'
down_revision = '5b2d9e4c7a19'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a model that already had the field has it
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("sources")}
    if "batch_bytes" not in have:
        with op.batch_alter_table("sources", schema=None) as batch_op:
            batch_op.add_column(sa.Column("batch_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sources", schema=None) as batch_op:
        batch_op.drop_column("batch_bytes")
