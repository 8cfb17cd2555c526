"""targets.maintenance: the table maintenance block of a target (lakehouse.table.maintenance), JSON text

Revision ID: 73f2c8cc6b1d
Revises: 0001
Create Date: 2026-11-23 17:21:10.147175
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '73f2c8cc6b1d'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only if missing: a control DB made before migrations existed by `create_all` over a model that
    # already had the field has the column (the baseline likewise creates only what a DB lacks)
    if "maintenance" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("targets")}:
        return
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('maintenance', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.drop_column('maintenance')

