"""files.expires_at and batches.output_expires_after_s: a file uploaded with `expires_after`, or a batch's output
written under `output_expires_after`, is deleted (row and bytes) by the reaper once it expires

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("files", sa.Column("expires_at", sa.Integer(), nullable=True))
    op.create_index("ix_files_expires_at", "files", ["expires_at"])
    op.create_index("ix_files_tenant_created_at", "files", ["tenant", "created_at", "id"])
    op.add_column("batches", sa.Column("output_expires_after_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_index("ix_files_tenant_created_at", table_name="files")
    op.drop_index("ix_files_expires_at", table_name="files")
    with op.batch_alter_table("files") as batch:
        batch.drop_column("expires_at")
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("output_expires_after_s")
