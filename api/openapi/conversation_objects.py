"""The Conversations API's objects as pydantic models, for the OpenAPI document only: api/conversations builds them as
dicts; the schemathesis run checks that they agree."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class Conversation(BaseModel):
    id: str
    object: Literal["conversation"]
    created_at: int
    metadata: dict[str, str]


class ConversationDeleted(BaseModel):
    id: str
    object: Literal["conversation.deleted"]
    deleted: Literal[True]


class ConversationItem(BaseModel, extra="allow"):
    """An input item as given (a message, function_call or function_call_output), or a response's output item."""

    id: str
    type: Literal["message", "function_call", "function_call_output"]


class ConversationItemList(BaseModel):
    object: Literal["list"]
    data: list[ConversationItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


ITEM_INCLUDE = {
    "name": "include",
    "in": "query",
    "required": False,
    "schema": {"type": "array", "items": {"type": "string"}},
    "description": "OpenAI's includable fields: accepted, adding nothing",
}
ITEM_LIST_PARAMETERS: tuple[dict[str, Any], ...] = (
    {"name": "limit", "in": "query", "required": False, "description": "Page size",
     "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
    {"name": "order", "in": "query", "required": False, "description": "desc: newest first",
     "schema": {"type": "string", "enum": ["asc", "desc"], "default": "desc"}},
    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "An item id: list the items after it in this order"},
    ITEM_INCLUDE,
)  # fmt: skip
