"""The SQL tables of the Conversations API: a conversation owned by a tenant, and its items in order. An item is an
input item as a response stores it (tasks/store/response_models.py) with its id; a response's output joins its
conversation as a placeholder row naming the response until the response has ended (api/conversations/turns.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from tasks.store.models import Base


class ConversationRecord(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "conv_..."
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[int] = mapped_column(Integer)  # unix seconds
    metadata_: Mapped[dict[str, str]] = mapped_column("metadata", JSON)
    # Positions handed out so far: each added item takes the next, so concurrent additions keep their order.
    num_positions: Mapped[int] = mapped_column(Integer, default=0)


class ConversationItemRecord(Base):
    __tablename__ = "conversation_items"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    id: Mapped[str] = mapped_column(String(64), index=True)  # "msg_...", "fc_...", "fco_..."
    # Items list in (position, seq) order: a response's output items take its placeholder's position.
    position: Mapped[int] = mapped_column(Integer)
    # The item as an input item's JSON (id, type, status included); None on a placeholder.
    item: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # A placeholder for this response's output; not a foreign key: the response may be deleted before it is read.
    response_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
