"""batch_lines.logprobs: a batch line's token logprobs, for the output line's choice like a request's result

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_lines", sa.Column("logprobs", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch_lines") as batch:
        batch.drop_column("logprobs")
