"""Validation of a batch's input file, line by line, with exactly the checks the interactive endpoints make."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from api.chat.generation import build_generate_request
from api.chat.prompts import chat_prompt_ids, completion_prompt_ids
from api.chat.schemas import ChatCompletionRequest, CompletionRequest, StrictModel
from api.embeddings.embed_request import build_embed_request
from api.embeddings.schemas import EmbeddingRequest
from api.errors import APIError, validation_error_info
from api.gate.body_checks import check_json_values, load_json_object, unsafe_text_reason
from api.responses.conversation import echoed_params, response_request, stored_items
from api.responses.schemas import ResponseCreateRequest
from api.services import model_info_for
from api.structured.tools import tool_plan
from tasks.batches.messages import ResponseLine
from tasks.messages.embeddings import EmbedRequest
from tasks.messages.generation import Endpoint, ErrorInfo, GenerateRequest

MAX_CUSTOM_ID_LENGTH = 512  # the batch_lines.custom_id column
GENERATION_URLS = {"/v1/chat/completions": Endpoint.CHAT, "/v1/completions": Endpoint.COMPLETIONS}
EMBEDDINGS_URL, RESPONSES_URL = "/v1/embeddings", "/v1/responses"
URL_ENDPOINTS = frozenset(
    {*GENERATION_URLS, EMBEDDINGS_URL, RESPONSES_URL}
)  # a batch's `endpoint`, every one of its lines' `url`


class InputLine(StrictModel):
    custom_id: str = Field(min_length=1, max_length=MAX_CUSTOM_ID_LENGTH)
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class ParsedLine:
    """A valid line has a request; an invalid one has an error naming its line number."""

    line_no: int
    custom_id: str | None
    request: GenerateRequest | EmbedRequest | ResponseLine | None = None
    error: dict[str, Any] | None = None


class LineError(Exception):
    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


def iter_lines(content: bytes) -> Iterator[tuple[int, bytes]]:
    """Every non-blank line of a JSONL file with its number, counted from 1 as editors count; lines end at "\n" only
    (a U+2028 inside a JSON string does not end one)."""
    start, line_no = 0, 0
    while start < len(content):
        end = content.find(b"\n", start)
        end = len(content) if end < 0 else end
        line_no += 1
        raw = content[start:end]
        start = end + 1
        if raw.strip():
            yield line_no, raw


def parse_line(
    batch_model: str | None, line_no: int, raw: bytes, batch_url: str, tenant: str, seen: set[str], max_bytes: int
) -> ParsedLine:
    """One line as `tenant`'s request, or its error naming the line: a line is checked as a request body is (size,
    JSON, numbers, strings, then the endpoint's validation), and must name `batch_model`, the model of the batch's
    earlier valid lines (None before the first), as OpenAI's batches run one model; call inside an app context."""
    custom_id = None
    try:
        if len(raw) > max_bytes:
            message = f"The line is {len(raw)} bytes; a request body may have at most {max_bytes}."
            raise LineError(ErrorInfo(message, code="line_too_large"))
        value = load_json_object(raw)
        custom_id = _storable_custom_id(value.get("custom_id"))  # named in the error line, whatever else is wrong
        check_json_values(value)
        line = InputLine.model_validate(value)
        if line.custom_id in seen:
            message = f"custom_id {line.custom_id!r} repeats an earlier line"
            raise LineError(ErrorInfo(message, param="custom_id", code="duplicate_custom_id"))
        seen.add(line.custom_id)
        if line.url != batch_url:
            message = f"url must be the batch's endpoint {batch_url}, not {line.url!r}"
            raise LineError(ErrorInfo(message, param="url", code="invalid_url"))
        request = line_request(batch_model, line.url, line.body, tenant)
    except LineError as exc:
        return ParsedLine(line_no, custom_id, error=_with_line(exc.info, line_no))
    except ValidationError as exc:
        return ParsedLine(line_no, custom_id, error=_with_line(validation_error_info(exc), line_no))
    except APIError as exc:
        return ParsedLine(line_no, custom_id, error=_with_line(exc.info, line_no))
    return ParsedLine(line_no, custom_id, request=request)


def _storable_custom_id(value: object) -> str | None:
    """The line's custom_id as its error line reports it, when the ledger's column takes it (else the checks say
    why)."""
    if isinstance(value, str) and 0 < len(value) <= MAX_CUSTOM_ID_LENGTH and unsafe_text_reason(value) is None:
        return value
    return None


def line_request(
    batch_model: str | None, url: str, body: dict[str, Any], tenant: str
) -> GenerateRequest | EmbedRequest | ResponseLine:
    """The request one line's body makes, validated like a POST to its `url`."""
    if url == RESPONSES_URL:
        return response_line(batch_model, body, tenant)
    if url != EMBEDDINGS_URL:
        return generate_request(batch_model, GENERATION_URLS[url], body, tenant)
    fields = EmbeddingRequest.model_validate(body)
    info = model_info_for(fields.model)
    _check_batch_model(batch_model, fields.model)
    return build_embed_request(info, fields, tenant)


def response_line(batch_model: str | None, body: dict[str, Any], tenant: str) -> ResponseLine:
    """A Responses API body as a batch line: it runs as the chat request it makes interactively; nothing is stored,
    streamed or run in the background, and it continues no stored response."""
    fields = ResponseCreateRequest.model_validate(body)
    for param in ("stream", "background"):
        if getattr(fields, param):
            message = f"{param} is not supported in batch requests"
            raise LineError(ErrorInfo(message, param=param, code="invalid_value"))
    if fields.previous_response_id is not None:
        message = "A batch line answers its own input; previous_response_id is not supported in batch requests."
        raise LineError(ErrorInfo(message, param="previous_response_id", code="invalid_value"))
    info = model_info_for(fields.model)
    _check_batch_model(batch_model, fields.model)
    generate = response_request(info, fields, fields.input, tenant)
    response_id = "resp_" + uuid.uuid4().hex
    return ResponseLine(generate, response_id, fields.instructions, stored_items(fields.input), echoed_params(fields))


def _check_batch_model(batch_model: str | None, model: str) -> None:
    if batch_model is not None and model != batch_model:
        message = f"A batch's lines name one model; earlier lines name {batch_model!r}, this one {model!r}"
        raise LineError(ErrorInfo(message, param="model", code="model_mismatch"))


def generate_request(batch_model: str | None, endpoint: Endpoint, body: dict[str, Any], tenant: str) -> GenerateRequest:
    """The request one line's body makes, validated like a POST to its endpoint; a batch line never streams."""
    fields = (
        ChatCompletionRequest.model_validate(body)
        if endpoint == Endpoint.CHAT
        else CompletionRequest.model_validate(body)
    )
    if fields.stream:
        raise LineError(ErrorInfo("stream is not supported in batch requests", param="stream", code="invalid_value"))
    info = model_info_for(fields.model)
    _check_batch_model(batch_model, fields.model)
    if isinstance(fields, ChatCompletionRequest):
        tools = tool_plan(info.tokenizer, fields, info.tool_call_parser)
        prompt_ids = chat_prompt_ids(info.tokenizer, fields.messages, tools.template_tools, fields)
        return build_generate_request(info, endpoint, fields, prompt_ids, tenant, tools)
    special = fields.add_special_tokens
    first, *more = [completion_prompt_ids(info.tokenizer, prompt, special) for prompt in fields.prompts]
    return build_generate_request(info, endpoint, fields, first, tenant, more_prompt_ids=more)


def _with_line(info: ErrorInfo, line_no: int) -> dict[str, Any]:
    return {"code": info.code or info.type, "message": info.message, "param": info.param, "line": line_no}
