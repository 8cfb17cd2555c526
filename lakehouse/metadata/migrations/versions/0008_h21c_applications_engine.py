"""applications.engine and applications.arrow_max_bytes: entity_raw loads on the Arrow engine (issue 21)

Revision ID: 3e8c1f0a2b77
Revises: c90db1221d4f
Create Date: 2026-11-26 11:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '3e8c1f0a2b77'
down_revision = 'c90db1221d4f'
branch_labels = None
depends_on = None

COLUMNS = (("engine", sa.String(length=64)), ("arrow_max_bytes", sa.BigInteger()))


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a model that already had the fields has them
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("applications")}
    with op.batch_alter_table("applications", schema=None) as batch_op:
        for name, type_ in COLUMNS:
            if name not in have:
                batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("applications", schema=None) as batch_op:
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
