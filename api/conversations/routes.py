"""OpenAI's Conversations API: POST /v1/conversations; GET, POST (metadata) and DELETE /v1/conversations/{id}; its
items: GET (paged) and POST /v1/conversations/{id}/items, GET and DELETE /v1/conversations/{id}/items/{item_id}.
Stored in SQL, owned by the caller's tenant; responses add turns (api/conversations/turns.py)."""

from __future__ import annotations

import time
import uuid

from flask import Blueprint, Response, jsonify

from api.batches.pages import cursor_page, ordered_item_page, page_limit
from api.conversations.schemas import (
    ConversationCreateRequest,
    ConversationUpdateRequest,
    ItemsCreateRequest,
    check_include,
)
from api.conversations.turns import (
    conversation_items,
    conversation_object,
    find_conversation,
    new_items,
    settled_rows,
)
from api.errors import APIError
from api.gate.auth import current_principal
from api.gate.request_limits import read_json_object
from api.services import db_session, services
from tasks.store.conversation_models import ConversationItemRecord, ConversationRecord
from tasks.store.conversation_store import add_items, delete_conversation, delete_item

bp = Blueprint("conversations", __name__)
DEFAULT_ITEMS_LIMIT, MAX_ITEMS_LIMIT = 20, 100  # OpenAI's


@bp.post("/v1/conversations")
def create() -> Response:
    body = ConversationCreateRequest.model_validate(read_json_object())
    session = db_session()
    record = ConversationRecord(
        id="conv_" + uuid.uuid4().hex,
        tenant=current_principal().tenant,
        created_at=int(time.time()),
        metadata_=body.metadata or {},
        num_positions=0,
    )
    session.add(record)
    session.flush()
    add_items(session, record.id, new_items(body.items or []), response_id=None)
    session.commit()
    return jsonify(conversation_object(record))


@bp.get("/v1/conversations/<conversation_id>")
def retrieve(conversation_id: str) -> Response:
    return jsonify(conversation_object(_find(conversation_id)))


@bp.post("/v1/conversations/<conversation_id>")
def update(conversation_id: str) -> Response:
    body = ConversationUpdateRequest.model_validate(read_json_object())
    record = _find(conversation_id)
    record.metadata_ = body.metadata or {}
    db_session().commit()
    return jsonify(conversation_object(record))


@bp.delete("/v1/conversations/<conversation_id>")
def delete(conversation_id: str) -> Response:
    delete_conversation(db_session(), _find(conversation_id))
    return jsonify({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@bp.get("/v1/conversations/<conversation_id>/items")
def list_items(conversation_id: str) -> Response:
    """`limit`, `order` (desc, newest first, by default), `after` (an item id), `include`."""
    check_include()
    limit = page_limit(DEFAULT_ITEMS_LIMIT, MAX_ITEMS_LIMIT)
    items = conversation_items(db_session(), _find(conversation_id).id, services().config.tool_call_parser)
    return jsonify(ordered_item_page(items, limit, "Item"))


@bp.post("/v1/conversations/<conversation_id>/items")
def create_items(conversation_id: str) -> Response:
    """Appended after every item so far, a running response's output included."""
    check_include()
    body = ItemsCreateRequest.model_validate(read_json_object())
    session = db_session()
    items = new_items(body.items)
    add_items(session, _find(conversation_id).id, items, response_id=None)
    session.commit()
    return jsonify(cursor_page(items, has_more=False))


@bp.get("/v1/conversations/<conversation_id>/items/<item_id>")
def retrieve_item(conversation_id: str, item_id: str) -> Response:
    check_include()
    item = _find_item(conversation_id, item_id).item
    assert item is not None, "placeholders are never found"
    return jsonify(item)


@bp.delete("/v1/conversations/<conversation_id>/items/<item_id>")
def delete_conversation_item(conversation_id: str, item_id: str) -> Response:
    """Answers the conversation, as OpenAI does."""
    delete_item(db_session(), _find_item(conversation_id, item_id))
    return jsonify(conversation_object(_find(conversation_id)))


def _find(conversation_id: str) -> ConversationRecord:
    return find_conversation(db_session(), conversation_id, current_principal().tenant, param="conversation_id")


def _find_item(conversation_id: str, item_id: str) -> ConversationItemRecord:
    rows = settled_rows(db_session(), _find(conversation_id).id, services().config.tool_call_parser)
    for row in rows:
        if row.item is not None and row.id == item_id:
            return row
    raise APIError(404, f"Item with id '{item_id}' not found.", param="item_id", code="not_found")
