"""A conversation's items as objects, and the turns responses add: a response given `conversation` reads the
conversation's items as the start of its input, then appends its new input items and, once it has ended, its output
items. The output joins as a placeholder naming the response; whoever next reads the conversation (or ends the
response) puts the output items in its place."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from api.errors import APIError
from api.responses.conversation import read_items, stored_items
from tasks.messages.response_objects import INPUT_ITEM_PREFIX, output_items
from tasks.store.conversation_models import ConversationItemRecord, ConversationRecord
from tasks.store.conversation_store import (
    add_items,
    conversation_rows,
    get_owned_conversation,
    replace_placeholder,
)
from tasks.store.response_models import ResponseRecord


def find_conversation(session: Session, conversation_id: str, tenant: str, param: str) -> ConversationRecord:
    record = get_owned_conversation(session, conversation_id, tenant)
    if record is None:
        message = f"Conversation with id '{conversation_id}' not found."
        raise APIError(404, message, param=param, code="not_found")
    return record


def conversation_object(record: ConversationRecord) -> dict[str, Any]:
    return {"id": record.id, "object": "conversation", "created_at": record.created_at, "metadata": record.metadata_}


def new_items(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as the conversation keeps them: each under an id of its own (an id the caller gave, as on an
    output item given back, is already another item's), a message with its status."""
    stored = []
    for item in stored_items(items):
        kind = item.get("type", "message")
        stored.append({**item, "id": f"{INPUT_ITEM_PREFIX[kind]}_{uuid.uuid4().hex}", "type": kind})
        if kind == "message":
            stored[-1].setdefault("status", "completed")
    return stored


def settled_rows(session: Session, conversation_id: str, tool_parser: str) -> list[ConversationItemRecord]:
    """The conversation's rows with every ended response's output in its placeholder's place; placeholders of
    responses still running stay."""
    rows = conversation_rows(session, conversation_id)
    pending = [row for row in rows if row.response_id is not None]
    changed = False
    for placeholder in pending:
        response = session.get(ResponseRecord, placeholder.response_id)
        if response is None or response.request.is_finished:
            replace_placeholder(session, placeholder, [] if response is None else output_items(response, tool_parser))
            changed = True
    return conversation_rows(session, conversation_id) if changed else rows


def conversation_items(session: Session, conversation_id: str, tool_parser: str) -> list[dict[str, Any]]:
    """The items, oldest first, of every turn that has ended."""
    return [row.item for row in settled_rows(session, conversation_id, tool_parser) if row.item is not None]


def conversation_prefix(session: Session, conversation_id: str, tool_parser: str) -> list[Any]:
    """What a new response in the conversation reads before its own input; refused while a response in it runs, whose
    output would land between the earlier turns and this one."""
    rows = settled_rows(session, conversation_id, tool_parser)
    if any(row.response_id is not None for row in rows):
        message = "Another response in this conversation has not finished yet; retry once it has."
        raise APIError(400, message, param="conversation", code="conversation_locked")
    return read_items([row.item for row in rows if row.item is not None])


def add_turn(session: Session, conversation_id: str, items: list[Any], response_id: str) -> None:
    """The response's new input items, then the place of its output. Commits."""
    add_items(session, conversation_id, new_items(items), response_id)
    session.commit()


def settle_response(session: Session, record: ResponseRecord, tool_parser: str) -> None:
    """Before an ended response is deleted (store false, or DELETE), its output joins its conversation."""
    conversation = record.params.get("conversation")
    if conversation is None or not record.request.is_finished:
        return
    for row in conversation_rows(session, conversation["id"]):
        if row.response_id == record.id:
            replace_placeholder(session, row, output_items(record, tool_parser))
