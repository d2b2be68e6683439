"""responses: the Responses API's stored responses, each owned by a tenant and backed by one request

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(64), sa.ForeignKey("requests.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("store", sa.Boolean(), nullable=False),
        sa.Column("background", sa.Boolean(), nullable=False),
        sa.Column("previous_response_id", sa.String(64), nullable=True),
        sa.Column("instructions", sa.Text(), nullable=True),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
    )
    op.create_index("ix_responses_tenant", "responses", ["tenant"])
    op.create_index("ix_responses_request_id", "responses", ["request_id"])


def downgrade() -> None:
    op.drop_table("responses")
