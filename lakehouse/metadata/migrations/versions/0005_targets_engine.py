"""targets.engine and targets.arrow_max_bytes: the write engine of a target (issue 21)

Revision ID: dbefa67f8e56
Revises: 5b1e0c9a7d42
Create Date: 2026-11-23 22:29:55
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = 'dbefa67f8e56'
down_revision = '5b1e0c9a7d42'
branch_labels = None
depends_on = None

COLUMNS = (("engine", sa.String(length=64)), ("arrow_max_bytes", sa.BigInteger()))


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a model that already had the fields has them
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("targets")}
    with op.batch_alter_table("targets", schema=None) as batch_op:
        for name, type_ in COLUMNS:
            if name not in have:
                batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("targets", schema=None) as batch_op:
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
