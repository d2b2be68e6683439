"""SQL tables: one row per accepted request, one result row per finished request."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from tasks.store.tenants import DEFAULT_TENANT


class Base(DeclarativeBase):
    pass


class RequestStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({RequestStatus.COMPLETED, RequestStatus.FAILED, RequestStatus.CANCELLED})


class RequestRecord(Base):
    __tablename__ = "requests"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), default=DEFAULT_TENANT, server_default=DEFAULT_TENANT)
    endpoint: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(256))
    status: Mapped[str] = mapped_column(String(16), index=True)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    created: Mapped[int] = mapped_column(Integer)  # unix seconds, OpenAI's `created`
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    worker: Mapped[str | None] = mapped_column(String(256), nullable=True)  # Celery node that claimed it
    result: Mapped[ResultRecord | None] = relationship(back_populates="request", uselist=False, lazy="joined")

    @property
    def is_finished(self) -> bool:
        return RequestStatus(self.status) in TERMINAL_STATUSES


class ResultRecord(Base):
    __tablename__ = "results"

    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), primary_key=True)
    text: Mapped[str] = mapped_column(Text, default="")
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    logprobs: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)  # chat's content entries
    extra_choices: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)  # n > 1: ChoiceResults
    steering: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the steering that ran
    monitor: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # the monitored positions
    usage_details: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # UsageDetails
    prompt_logprobs: Mapped[list[dict[str, Any] | None] | None] = mapped_column(JSON, nullable=True)  # choice 0's
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    request: Mapped[RequestRecord] = relationship(back_populates="result")
