"""Validation of a batch's input file, line by line, with exactly the checks the interactive endpoints make."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from api.errors import APIError, validation_error_info
from api.generation import build_generate_request, check_model_name
from api.prompts import ModelInfo, chat_prompt_ids, completion_prompt_ids
from api.schemas import ChatCompletionRequest, CompletionRequest, StrictModel
from api.tools import tool_plan
from tasks.messages import Endpoint, ErrorInfo, GenerateRequest

URL_ENDPOINTS = {"/v1/chat/completions": Endpoint.CHAT, "/v1/completions": Endpoint.COMPLETIONS}


class InputLine(StrictModel):
    custom_id: str = Field(min_length=1, max_length=512)
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class ParsedLine:
    """A valid line has a request; an invalid one has an error naming its line number."""

    line_no: int
    custom_id: str | None
    request: GenerateRequest | None = None
    error: dict[str, Any] | None = None


class LineError(Exception):
    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.message)
        self.info = info


def parse_lines(info: ModelInfo, content: bytes, batch_url: str, tenant: str) -> list[ParsedLine]:
    """Every non-blank line of `content`, numbered from 1, valid or with its error, as `tenant`'s requests; call
    inside a request."""
    parsed: list[ParsedLine] = []
    seen_custom_ids: set[str] = set()
    for line_no, raw in enumerate(content.decode("utf-8", errors="replace").splitlines(), start=1):
        if raw.strip():
            parsed.append(_parse_line(info, line_no, raw, batch_url, tenant, seen_custom_ids))
    return parsed


def _parse_line(info: ModelInfo, line_no: int, raw: str, batch_url: str, tenant: str, seen: set[str]) -> ParsedLine:
    custom_id = None
    try:
        value = _json_object(raw)
        custom_id = value["custom_id"] if isinstance(value.get("custom_id"), str) else None
        line = InputLine.model_validate(value)
        if line.custom_id in seen:
            message = f"custom_id {line.custom_id!r} repeats an earlier line"
            raise LineError(ErrorInfo(message, param="custom_id", code="duplicate_custom_id"))
        seen.add(line.custom_id)
        if line.url != batch_url:
            message = f"url must be the batch's endpoint {batch_url}, not {line.url!r}"
            raise LineError(ErrorInfo(message, param="url", code="invalid_url"))
        request = generate_request(info, URL_ENDPOINTS[line.url], line.body, tenant)
    except LineError as exc:
        return ParsedLine(line_no, custom_id, error=_with_line(exc.info, line_no))
    except ValidationError as exc:
        return ParsedLine(line_no, custom_id, error=_with_line(validation_error_info(exc), line_no))
    except APIError as exc:
        return ParsedLine(line_no, custom_id, error=_with_line(exc.info, line_no))
    return ParsedLine(line_no, custom_id, request=request)


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise LineError(ErrorInfo(f"The line is not valid JSON: {exc}", code="invalid_json")) from exc
    if not isinstance(value, dict):
        raise LineError(ErrorInfo("Each line must be a JSON object.", code="invalid_json"))
    return value


def generate_request(info: ModelInfo, endpoint: Endpoint, body: dict[str, Any], tenant: str) -> GenerateRequest:
    """The request one line's body makes, validated like a POST to its endpoint; a batch line never streams."""
    fields = (
        ChatCompletionRequest.model_validate(body)
        if endpoint == Endpoint.CHAT
        else CompletionRequest.model_validate(body)
    )
    if fields.stream:
        raise LineError(ErrorInfo("stream is not supported in batch requests", param="stream", code="invalid_value"))
    check_model_name(fields.model)
    if isinstance(fields, ChatCompletionRequest):
        tools = tool_plan(info.tokenizer, fields, info.tool_call_parser)
        prompt_ids = chat_prompt_ids(info.tokenizer, fields.messages, tools.template_tools)
        return build_generate_request(info, endpoint, fields, prompt_ids, tenant, tools)
    prompt_ids = completion_prompt_ids(info.tokenizer, fields.prompt)
    return build_generate_request(info, endpoint, fields, prompt_ids, tenant)


def _with_line(info: ErrorInfo, line_no: int) -> dict[str, Any]:
    return {"code": info.code or info.type, "message": info.message, "param": info.param, "line": line_no}
