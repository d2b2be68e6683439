"""SQL tables of the Batch API: uploaded and produced files, batches, and the ledger of one row per batch line."""

from __future__ import annotations

from enum import Enum
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, deferred, mapped_column

from tasks.store.models import Base
from tasks.store.tenants import DEFAULT_TENANT


class BatchStatus(str, Enum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL_BATCH_STATUSES = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


class LineStatus(str, Enum):
    QUEUED = "queued"  # waiting to be dispatched
    DISPATCHED = "dispatched"  # its chunk task is on the bulk queue
    RUNNING = "running"  # a worker claimed it and holds its lease
    COMPLETED = "completed"
    FAILED = "failed"  # invalid, or its workers died `batch_max_attempts` times, or the engine failed it
    CANCELLED = "cancelled"
    EXPIRED = "expired"


OPEN_LINE_STATUSES = frozenset({LineStatus.QUEUED, LineStatus.DISPATCHED, LineStatus.RUNNING})
OPEN_LINE_VALUES = tuple(status.value for status in OPEN_LINE_STATUSES)


class FileRecord(Base):
    __tablename__ = "files"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_files_tenant_idempotency_key"),
        Index("ix_files_tenant_created_at", "tenant", "created_at", "id"),  # a tenant's files, in either order
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), default=DEFAULT_TENANT, server_default=DEFAULT_TENANT)
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(512))
    bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(Integer)
    # In the database, not on a disk: api and workers on different machines see the same files, and a batch's
    # output file commits in the same transaction as its final status.
    content: Mapped[bytes] = deferred(mapped_column(LargeBinary, nullable=False))
    idempotency_key: Mapped[str | None] = mapped_column(String(256), nullable=True)  # unique per tenant
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # unix seconds; None: kept until deleted. The reaper deletes an expired file, row and bytes.
    expires_at: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)


class BatchRecord(Base):
    __tablename__ = "batches"
    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_batches_tenant_idempotency_key"),
        Index("ix_batches_tenant_id", "tenant", "id"),  # a tenant's batches, newest first
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), default=DEFAULT_TENANT, server_default=DEFAULT_TENANT)
    endpoint: Mapped[str] = mapped_column(String(64))  # the url of every line, e.g. /v1/chat/completions
    model: Mapped[str] = mapped_column(String(256))
    input_file_id: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)
    batch_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON, nullable=True)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    output_file_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # unix seconds, OpenAI's timestamps; expired_at is set when expiry begins, so running lines end as expired
    created_at: Mapped[int] = mapped_column(Integer, index=True)
    expires_at: Mapped[int] = mapped_column(Integer)
    in_progress_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    finalizing_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    completed_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    failed_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    expired_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cancelling_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cancelled_at: Mapped[int | None] = mapped_column(Integer, nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(256), nullable=True)  # unique per tenant
    request_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # unix seconds; while validating, the api validating it renews this, and the reaper fails it once it lapses
    validation_lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # OpenAI's output_expires_after: the output and error files expire this long after they are written; None: kept
    output_expires_after_s: Mapped[int | None] = mapped_column(Integer, nullable=True)

    @property
    def is_finished(self) -> bool:
        return BatchStatus(self.status) in TERMINAL_BATCH_STATUSES


class BatchLine(Base):
    """One input line: the source of truth for what ran, where, how often, and its one result."""

    __tablename__ = "batch_lines"
    __table_args__ = (
        UniqueConstraint("batch_id", "line_no", name="uq_batch_lines_batch_line"),
        Index("ix_batch_lines_batch_status", "batch_id", "status"),
        Index("ix_batch_lines_status_lease", "status", "lease_expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    line_no: Mapped[int] = mapped_column(Integer)  # 1-based, as editors count
    custom_id: Mapped[str | None] = mapped_column(String(512), nullable=True)  # None when the line is not JSON
    request_id: Mapped[str] = mapped_column(String(64))  # the id of its completion object and engine request
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    chunk_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    lease_owner: Mapped[str | None] = mapped_column(String(256), nullable=True)  # the worker that claimed it last
    lease_expires_at: Mapped[float | None] = mapped_column(
        Float, nullable=True
    )  # unix seconds; also the dispatch deadline
    request: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # a GenerateRequest; None if invalid
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    logprobs: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)  # chat's content entries
    steering: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the steering that ran
    monitor: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the monitored positions
    extra_choices: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)  # n > 1: choices 1..
    prompt_logprobs: Mapped[list[dict[str, Any] | None] | None] = mapped_column(JSON, nullable=True)  # choice 0's

    @property
    def is_open(self) -> bool:
        return LineStatus(self.status) in OPEN_LINE_STATUSES
