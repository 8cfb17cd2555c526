"""stages.incremental, targets.time_partition: a stage's incremental block and a target's daily
partitions (lakehouse.stage.incremental), JSON text

Revision ID: 415e3af6ab69
Revises: 73f2c8cc6b1d
Create Date: 2026-11-23 19:27:37.757572
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '415e3af6ab69'
down_revision = '73f2c8cc6b1d'
branch_labels = None
depends_on = None


COLUMNS = (("stages", "incremental"), ("targets", "time_partition"))


def upgrade() -> None:
    for table, column in COLUMNS:
        # only if missing: a control DB made by `create_all` over a model that already had the field has it
        if column in {c["name"] for c in sa.inspect(op.get_bind()).get_columns(table)}:
            continue
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column(column, sa.Text(), nullable=True))


def downgrade() -> None:
    for table, column in COLUMNS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column(column)
