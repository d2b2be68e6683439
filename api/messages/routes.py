"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens. A message runs as a chat request on the
chat path (api/chat/generation.py: admission, the ledger row, the queue, the wait or the stream), its row recording
the chat request it ran as; errors on these routes are in Anthropic's shape."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

from flask import Blueprint, Response, jsonify

from api.chat.generation import build_generate_request, cancel_generation, record_and_enqueue, wait_for_finished
from api.chat.prompts import chat_prompt_ids
from api.chat.schemas import ChatCompletionRequest
from api.gate.auth import current_principal
from api.gate.request_ids import note_request_id, response_request_id
from api.gate.request_limits import read_json_object
from api.messages.conversion import chat_request, messages_params
from api.messages.events import PING, MessageEvents
from api.messages.objects import error_body, message_object
from api.messages.schemas import MessageCountTokensRequest, MessageCreateRequest, MessagesInput
from api.models.model_info import ModelInfo
from api.services import model_info_for, services
from api.streaming.sse import resumable_response
from api.streaming.typed_events import translated_events
from api.structured.tools import ToolPlan, tool_plan
from tasks.messages.generation import Endpoint, ErrorInfo
from tasks.store.models import RequestRecord
from tasks.streams.attachments import attach

logger = logging.getLogger(__name__)
bp = Blueprint("messages", __name__)
ANTHROPIC_REQUEST_ID = "request-id"
INTERRUPTED = ErrorInfo("The event stream was interrupted.", "service_unavailable", None, "service_unavailable")


@bp.post("/v1/messages")
def create() -> Response:
    body = MessageCreateRequest.model_validate(read_json_object())
    info = model_info_for(body.model)
    with messages_params():
        chat, tools, prompt_ids = _chat_prompt(info, body)
        tenant = current_principal().tenant
        generate_request = build_generate_request(info, Endpoint.CHAT, chat, prompt_ids, tenant, tools)
    note_request_id(generate_request.request_id)
    record = record_and_enqueue(generate_request, chat.model_dump(mode="json", by_alias=True, exclude_unset=True))
    if body.stream:
        return _stream(record)
    return jsonify(message_object(wait_for_finished(record), services().config.tool_call_parser))


@bp.post("/v1/messages/count_tokens")
def count_tokens() -> Response:
    """The prompt's tokens as /v1/messages would run it: the chat template over the system prompt, the messages and
    the tools."""
    body = MessageCountTokensRequest.model_validate(read_json_object())
    info = model_info_for(body.model)
    with messages_params():
        _, _, prompt_ids = _chat_prompt(info, body)
    return jsonify({"input_tokens": len(prompt_ids)})


@bp.after_request
def in_anthropic_shape(response: Response) -> Response:
    """Every error these routes answer (from the view, authentication, the admission gate or a body limit) in
    Anthropic's shape: {"type": "error", "error": {"type", "message"}}, the status and headers kept; the message names
    the field at fault, as the `param` of OpenAI's shape did. Every answer carries Anthropic's `request-id` header
    (the anthropic SDK's `_request_id`)."""
    body = response.get_json(silent=True) if response.status_code >= 400 and response.is_json else None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message, param = str(error.get("message")), error.get("param")
        if param and param not in message:
            message = f"{param}: {message}"
        response.set_data(json.dumps(error_body(response.status_code, message)))
    response.headers[ANTHROPIC_REQUEST_ID] = response_request_id()
    return response


def _chat_prompt(info: ModelInfo, body: MessagesInput) -> tuple[ChatCompletionRequest, ToolPlan, list[int]]:
    chat = chat_request(body)
    tools = tool_plan(info.tokenizer, chat, info.tool_call_parser)
    return chat, tools, chat_prompt_ids(info.tokenizer, chat.messages, tools.template_tools, chat)


def _stream(record: RequestRecord) -> Response:
    """As chat's stream: a client that drops leaves the request running for STREAM_RESUME_GRACE_S (its events stay
    readable at /v1/requests/{id}/events), then a reaper cancels it."""
    request_id = record.id
    events = MessageEvents(record, record.body.get("stop") or [])

    def cancel() -> None:
        logger.info("stream of %s timed out; cancelling it", request_id)
        cancel_generation(request_id)

    def frames() -> Iterator[str]:
        yield from (_frame(event) for event in events.opening())
        for typed in translated_events(request_id, events, cancel, INTERRUPTED):
            yield from (_frame(event) for event in (typed if typed is not None else [PING]))

    svc = services()
    return resumable_response(frames(), attach(svc.redis, svc.config, request_id))


def _frame(event: dict[str, object]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
