"""results.steering and results.monitor: the steering that ran and the monitored positions (issue 5)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("results", sa.Column("steering", sa.JSON(), nullable=True))
    op.add_column("results", sa.Column("monitor", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.drop_column("monitor")
        batch.drop_column("steering")
