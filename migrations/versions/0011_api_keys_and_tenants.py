"""api_keys, and a tenant on requests, files and batches: rows made before tenancy belong to "default", and an
Idempotency-Key is unique per tenant instead of across all of them

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

DEFAULT_TENANT = "default"
# SQLite's copy of 0003's `unique=True` constraints has no name; batch mode names reflected ones by this convention.
NAMING = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=True),
        sa.Column("revoked", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column("requests", _tenant_column())
    for table in ("files", "batches"):
        old_name = _idempotency_constraint(table) or f"uq_{table}_idempotency_key"
        with op.batch_alter_table(table, naming_convention=NAMING) as batch:
            batch.add_column(_tenant_column())
            batch.drop_constraint(old_name, type_="unique")
            batch.create_unique_constraint(f"uq_{table}_tenant_idempotency_key", ["tenant", "idempotency_key"])
    op.create_index("ix_batches_tenant_id", "batches", ["tenant", "id"])


def downgrade() -> None:
    op.drop_index("ix_batches_tenant_id", table_name="batches")
    for table in ("files", "batches"):
        # Two tenants may have used the same key; only the default tenant's keys can stay unique across the table.
        op.execute(sa.text(f"UPDATE {table} SET idempotency_key = NULL WHERE tenant <> '{DEFAULT_TENANT}'"))
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"uq_{table}_tenant_idempotency_key", type_="unique")
            batch.create_unique_constraint(f"uq_{table}_idempotency_key", ["idempotency_key"])
            batch.drop_column("tenant")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("tenant")
    op.drop_table("api_keys")


def _tenant_column() -> sa.Column:
    return sa.Column("tenant", sa.String(64), nullable=False, server_default=DEFAULT_TENANT)


def _idempotency_constraint(table: str) -> str | None:
    """The name the database gave 0003's unique idempotency_key (PostgreSQL: files_idempotency_key_key)."""
    for constraint in sa.inspect(op.get_bind()).get_unique_constraints(table):
        if constraint["column_names"] == ["idempotency_key"]:
            return constraint["name"]
    raise RuntimeError(f"{table} has no unique idempotency_key to replace")
