"""OpenAI's Responses API: POST /v1/responses; GET (as JSON, or its event stream resumed after `starting_after`)
and DELETE /v1/responses/{id}; POST /v1/responses/{id}/cancel. A response runs as a chat request on the chat path
(api/chat/generation.py: admit, record, enqueue) and is stored in SQL owned by the caller's tenant."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, jsonify, request
from sqlalchemy.orm import Session

from api.batches.pages import ordered_item_page, page_limit
from api.chat.generation import (
    cancel_generation,
    record_and_enqueue,
    wait_for_finished,
)
from api.conversations.turns import add_turn, conversation_prefix, find_conversation, settle_response
from api.errors import APIError
from api.gate.auth import current_principal
from api.gate.request_limits import read_json_object
from api.responses.conversation import echoed_params, read_items, response_request, stored_items
from api.responses.schemas import ResponseCreateRequest
from api.responses.stream import FROM_START, response_frames, starting_after
from api.services import db_session, model_info_for, services
from api.streaming.sse import resumable_response, sse_response
from tasks.messages.response_objects import input_item_objects, output_items, response_object
from tasks.store.response_models import ResponseRecord
from tasks.store.response_store import create_response, delete_response, get_owned_response
from tasks.streams.attachments import attach
from tasks.streams.events import wait_for_final
from tasks.streams.redis_keys import RedisKeys

logger = logging.getLogger(__name__)
bp = Blueprint("responses", __name__)
CANCEL_WAIT_S = 5.0  # how long a cancel waits for the worker to stop the response before answering
DEFAULT_INPUT_ITEMS_LIMIT, MAX_INPUT_ITEMS_LIMIT = 20, 100  # OpenAI's


@bp.post("/v1/responses")
def create() -> Response:
    body = read_json_object()
    create_request = ResponseCreateRequest.model_validate(body)
    info = model_info_for(create_request.model)
    if create_request.background and not create_request.store:
        raise APIError(400, "A background response must be stored: store cannot be false.", param="background")
    conversation_id = create_request.conversation.id if create_request.conversation else None
    earlier = (
        _conversation_items(conversation_id) if conversation_id else _conversation(create_request.previous_response_id)
    )
    items = earlier + create_request.input
    request_record = record_and_enqueue(response_request(info, create_request, items, current_principal().tenant), body)
    record = ResponseRecord(
        id="resp_" + uuid.uuid4().hex,
        tenant=request_record.tenant,
        request_id=request_record.id,
        created_at=request_record.created,
        store=create_request.store,
        background=create_request.background,
        previous_response_id=create_request.previous_response_id,
        instructions=create_request.instructions,
        input_items=stored_items(items),
        params=echoed_params(create_request),
    )
    create_response(db_session(), record)
    if conversation_id is not None:
        add_turn(db_session(), conversation_id, create_request.input, record.id)
    logger.info("response %s runs as request %s", record.id, record.request_id)
    if create_request.stream:
        return _stream(record, FROM_START)
    if create_request.background:
        return jsonify(_object(record))
    return _wait(record)


@bp.get("/v1/responses/<response_id>")
def retrieve(response_id: str) -> Response:
    record = _find(response_id)
    after = starting_after()  # checked even without stream: a malformed parameter is refused, not ignored
    if not _is_stream_requested():
        return jsonify(_object(record))
    if record.request.is_finished and not services().redis.exists(_stream_key(record)):
        raise APIError(410, "The event stream has expired; GET the response for its output.", code="stream_expired")
    return _stream(record, after)


@bp.get("/v1/responses/<response_id>/input_items")
def list_input_items(response_id: str) -> Response:
    """OpenAI's list of a response's input items: `limit`, `order` (desc, newest first, by default), `after`."""
    items = input_item_objects(_find(response_id))
    limit = page_limit(DEFAULT_INPUT_ITEMS_LIMIT, MAX_INPUT_ITEMS_LIMIT)
    return jsonify(ordered_item_page(items, limit, "Input item"))


@bp.post("/v1/responses/<response_id>/cancel")
def cancel(response_id: str) -> Response:
    record = _find(response_id)
    if not record.background:
        raise APIError(400, "Only a background response can be cancelled.", param="response_id")
    if not record.request.is_finished:
        cancel_generation(record.request_id)
        idle_s = min(services().config.sse_heartbeat_s, 1.0)
        wait_for_final(services().streams.read_json, _stream_key(record), idle_s=idle_s, timeout_s=CANCEL_WAIT_S)
    return jsonify(_object(_reload(response_id)))


@bp.delete("/v1/responses/<response_id>")
def delete(response_id: str) -> Response:
    record = _find(response_id)
    if not record.request.is_finished:
        cancel_generation(record.request_id)
    settle_response(db_session(), record, services().config.tool_call_parser)
    delete_response(db_session(), record)
    return jsonify({"id": response_id, "object": "response", "deleted": True})


def _find(response_id: str) -> ResponseRecord:
    """The caller's stored response; another tenant's gets the same 404 as a missing one."""
    record = get_owned_response(db_session(), response_id, current_principal().tenant)
    if record is None:
        raise APIError(404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
    return record


def _conversation(previous_response_id: str | None) -> list[Any]:
    """The earlier turns a response continues: its previous response's input items, then that one's output."""
    if previous_response_id is None:
        return []
    previous = get_owned_response(db_session(), previous_response_id, current_principal().tenant)
    if previous is None:
        message = f"Previous response with id '{previous_response_id}' not found."
        raise APIError(404, message, param="previous_response_id", code="previous_response_not_found")
    if not previous.request.is_finished:
        message = f"Previous response with id '{previous_response_id}' has not finished yet."
        raise APIError(400, message, param="previous_response_id")
    return read_items(previous.input_items + output_items(previous, services().config.tool_call_parser))


def _conversation_items(conversation_id: str) -> list[Any]:
    """The conversation's items so far, which the response reads before its own input."""
    session, tenant = db_session(), current_principal().tenant
    find_conversation(session, conversation_id, tenant, param="conversation")
    return conversation_prefix(session, conversation_id, services().config.tool_call_parser)


def _stream_key(record: ResponseRecord) -> str:
    return RedisKeys(services().config.redis_prefix).request_stream(record.request_id)


def _is_stream_requested() -> bool:
    value = request.args.get("stream", "false").lower()
    if value not in ("true", "false"):
        raise APIError(400, "stream must be true or false.", param="stream")
    return value == "true"


def _object(record: ResponseRecord) -> dict[str, Any]:
    return response_object(record, services().config.tool_call_parser)


def _reload(response_id: str, session: Session | None = None) -> ResponseRecord:
    """The response as SQL has it now (the worker writes the result from another process), its request and result
    loaded, so it can be read after `session` closes."""
    session = session or db_session()
    session.expire_all()
    record = session.get(ResponseRecord, response_id)
    assert record is not None, "only DELETE removes a stored response"
    return record


def _forget(response_id: str, session: Session | None = None) -> None:
    """store false: nothing stays once the response has ended."""
    session = session or db_session()
    record = _reload(response_id, session)
    settle_response(session, record, services().config.tool_call_parser)
    delete_response(session, record)


def _wait(record: ResponseRecord) -> Response:
    try:
        wait_for_finished(record.request)
        return jsonify(_object(_reload(record.id)))
    finally:
        if not record.store:
            _forget(record.id)


def _stream(record: ResponseRecord, after: int) -> Response:
    """A background response runs on when its stream's client leaves; any other runs on for STREAM_RESUME_GRACE_S
    to be resumed (`starting_after`), then a reaper cancels it, as chat's streams are."""
    response_id, request_id, is_stored = record.id, record.request_id, record.store

    def cancel() -> None:
        logger.info("stream of %s timed out; cancelling it", response_id)
        try:
            cancel_generation(request_id)
        except Exception:  # the client is gone; nobody to tell but the log
            logger.exception("could not cancel %s", response_id)

    stop = (lambda: None) if record.background else cancel

    def load() -> ResponseRecord:
        with services().sessions() as session:
            return _reload(response_id, session)

    def frames() -> Iterator[str]:  # runs after the view returned: its own sessions, not the request's
        yield from response_frames(load(), after, load, on_timeout=stop)
        if not is_stored:
            with services().sessions() as session:
                _forget(response_id, session)

    if record.background or record.request.is_finished:
        return sse_response(frames())
    svc = services()
    return resumable_response(frames(), attach(svc.redis, svc.config, request_id))
