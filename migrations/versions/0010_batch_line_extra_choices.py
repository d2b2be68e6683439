"""batch_lines.extra_choices: choices 1..n-1 of a batch line with n > 1 (choice 0 keeps text, finish_reason, logprobs)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_lines", sa.Column("extra_choices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch_lines") as batch:
        batch.drop_column("extra_choices")
