"""conversations: the Conversations API's conversations, each owned by a tenant, and their items in order

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Integer(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("num_positions", sa.Integer(), nullable=False),
    )
    op.create_index("ix_conversations_tenant", "conversations", ["tenant"])
    op.create_table(
        "conversation_items",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "conversation_id",
            sa.String(64),
            sa.ForeignKey("conversations.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("item", sa.JSON(), nullable=True),
        sa.Column("response_id", sa.String(64), nullable=True),
    )
    op.create_index("ix_conversation_items_conversation_id", "conversation_items", ["conversation_id"])
    op.create_index("ix_conversation_items_id", "conversation_items", ["id"])


def downgrade() -> None:
    op.drop_table("conversation_items")
    op.drop_table("conversations")
