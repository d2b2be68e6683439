"""batch_lines.steering and .monitor: what a batch line's output reports about steering and monitoring

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_lines", sa.Column("steering", sa.JSON(), nullable=True))
    op.add_column("batch_lines", sa.Column("monitor", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch_lines") as batch:
        batch.drop_column("monitor")
        batch.drop_column("steering")
