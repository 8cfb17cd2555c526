"""stages.python_transformation (JSON text) and applications.validation_set_id: Python
transformation stages and the rule set of entity_raw loads (issue 18)

Revision ID: 5b1e0c9a7d42
Revises: 415e3af6ab69
Create Date: 2026-11-23 20:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '5b1e0c9a7d42'
down_revision = '415e3af6ab69'
branch_labels = None
depends_on = None

COLUMNS = (("stages", "python_transformation"), ("applications", "validation_set_id"))


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a model that already had the field has it
    inspector = sa.inspect(op.get_bind())
    for table, column in COLUMNS:
        if column in {c["name"] for c in inspector.get_columns(table)}:
            continue
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column(column, sa.Text(), nullable=True))


def downgrade() -> None:
    for table, column in COLUMNS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column(column)
