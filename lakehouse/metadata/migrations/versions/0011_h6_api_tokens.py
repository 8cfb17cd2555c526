"""api_tokens: per-tenant bearer tokens of the load API, stored hashed (issue 40 item 4)

Revision ID: 7d3a9c1e5b42
Revises: c4e81a6f2d30
Create Date: 2026-11-29 04:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '7d3a9c1e5b42'
down_revision = 'c4e81a6f2d30'
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "api_tokens" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(255), nullable=False),
        sa.Column("applications", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.String(128), nullable=False),
        sa.Column("label", sa.String(255), nullable=True),
        sa.Column("replaces", sa.String(32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_api_tokens_tenant", "api_tokens", ["tenant_id"])


def downgrade() -> None:
    op.drop_index("ix_api_tokens_tenant", table_name="api_tokens")
    op.drop_table("api_tokens")
