"""results.prompt_logprobs and batch_lines.prompt_logprobs: choice 0's vLLM prompt_logprobs, when the request asked
for them (further choices keep theirs in extra_choices)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("results", sa.Column("prompt_logprobs", sa.JSON(), nullable=True))
    op.add_column("batch_lines", sa.Column("prompt_logprobs", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table in ("results", "batch_lines"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("prompt_logprobs")
