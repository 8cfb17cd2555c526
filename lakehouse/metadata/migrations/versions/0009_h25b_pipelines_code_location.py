"""pipelines.code_location: the Dagster code location serving a pipeline (issue 22)

Revision ID: 5b2d9e4c7a19
Revises: 3e8c1f0a2b77
Create Date: 2026-11-26 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '5b2d9e4c7a19'
down_revision = '3e8c1f0a2b77'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a model that already had the field has it
    have = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("pipelines")}
    if "code_location" not in have:
        with op.batch_alter_table("pipelines", schema=None) as batch_op:
            batch_op.add_column(sa.Column("code_location", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pipelines", schema=None) as batch_op:
        batch_op.drop_column("code_location")
