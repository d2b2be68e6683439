"""requests and results

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "requests",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("created", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_requests_status", "requests", ["status"])
    op.create_table(
        "results",
        sa.Column(
            "request_id", sa.String(64), sa.ForeignKey("requests.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("results")
    op.drop_index("ix_requests_status", table_name="requests")
    op.drop_table("requests")
