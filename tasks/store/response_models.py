"""The SQL table of the Responses API: one row per stored response, owned by a tenant, over the chat request that
generates its output (whose result holds the text)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tasks.store.models import Base, RequestRecord


class ResponseRecord(Base):
    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "resp_..."
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[int] = mapped_column(Integer)  # unix seconds
    store: Mapped[bool] = mapped_column(Boolean)  # false: never retrievable, deleted once it ends
    background: Mapped[bool] = mapped_column(Boolean)
    previous_response_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    instructions: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The whole conversation this response answered, as input items (earlier responses' turns first).
    input_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    # What the response object echoes: temperature, top_p, max_output_tokens, metadata, text, tools, tool_choice.
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    request: Mapped[RequestRecord] = relationship(lazy="joined")
