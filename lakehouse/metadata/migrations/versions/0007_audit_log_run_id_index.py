"""audit_log.run_id index: a run's own rows (run summaries, `lakehouse audit --run`) without a full scan

Revision ID: c90db1221d4f
Revises: 7c3d9e1f2a60
Create Date: 2026-11-26 09:37:28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = 'c90db1221d4f'
down_revision = '7c3d9e1f2a60'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only if missing: a control DB made by `create_all` over a schema that already had it has it
    if "ix_audit_run" in {i["name"] for i in sa.inspect(op.get_bind()).get_indexes("audit_log")}:
        return
    op.create_index("ix_audit_run", "audit_log", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_audit_run", table_name="audit_log")
