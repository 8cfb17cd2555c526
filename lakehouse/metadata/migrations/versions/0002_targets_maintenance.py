"""targets.maintenance: table maintenance block per target

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
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.add_column(sa.Column('maintenance', sa.Text(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.drop_column('maintenance')

