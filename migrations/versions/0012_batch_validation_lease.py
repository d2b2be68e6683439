"""batches.validation_lease_expires_at: a batch's input file is validated in the background by the api that took
it, which renews this lease as it goes; the reaper fails a batch still validating once the lease lapses

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("validation_lease_expires_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("validation_lease_expires_at")
