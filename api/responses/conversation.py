"""A Responses API request as the chat request that runs it: the instructions, the stored conversation and the new
input items become chat messages; `tools`, `tool_choice` and `text.format` become chat's tools and response_format,
so the chat path's templates, grammars and tool parsing serve both."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from typing import Any

from pydantic import BaseModel

from api.chat.generation import build_generate_request
from api.chat.param_names import callers_params
from api.chat.prompts import chat_prompt_ids
from api.chat.schemas import ChatCompletionRequest
from api.models.model_info import ModelInfo
from api.responses.schemas import (
    INPUT_ITEMS,
    AllowedToolsToolChoice,
    FunctionCallItem,
    FunctionToolChoice,
    MessageItem,
    ResponseCreateRequest,
    TextConfig,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    ToolChoice,
)
from api.structured.tools import tool_plan
from tasks.messages.generation import Endpoint, GenerateRequest

# Where the chat path names a field of the chat request, the caller sent this field of theirs.
CHAT_PARAMS = (
    (re.compile(r"^tools\.(\d+)\.function\.parameters"), r"tools.\1.parameters"),
    (re.compile(r"^tool_choice\.allowed_tools\.tools"), "tool_choice.tools"),
    (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^messages"), "input"),
    (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
)
DEFAULT_TEXT = {"format": {"type": "text"}}


def response_request(info: ModelInfo, body: ResponseCreateRequest, items: list[Any], tenant: str) -> GenerateRequest:
    """The worker's request for `body` answering `items`, built and checked as chat's is; its 400s name the caller's
    fields."""
    with responses_params():
        chat = chat_request(body, items)
        tools = tool_plan(info.tokenizer, chat, info.tool_call_parser)
        prompt_ids = chat_prompt_ids(info.tokenizer, chat.messages, tools.template_tools)
        return build_generate_request(info, Endpoint.CHAT, chat, prompt_ids, tenant, tools)


def chat_request(body: ResponseCreateRequest, items: list[Any]) -> ChatCompletionRequest:
    """The chat request for `body` answering the conversation `items` (input items, earlier turns first)."""
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": chat_messages(body.instructions, items),
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_completion_tokens": body.max_output_tokens,
        "response_format": _response_format(body.text),
        "tools": [_chat_tool(tool.model_dump(exclude={"type"})) for tool in body.tools or []] or None,
        "tool_choice": _chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "user": body.user,
        "logprobs": body.wants_logprobs,
        "top_logprobs": body.top_logprobs if body.wants_logprobs else None,
    }
    return ChatCompletionRequest.model_validate({key: value for key, value in chat.items() if value is not None})


def chat_messages(instructions: str | None, items: list[Any]) -> list[dict[str, Any]]:
    """Calls follow the assistant message of their turn, as chat templates expect them."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return messages


def stored_items(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as JSON, to be read back with `read_items`."""
    return [item.model_dump(by_alias=True, exclude_none=True) for item in items]


def read_items(data: list[dict[str, Any]]) -> list[Any]:
    return INPUT_ITEMS.validate_python(data)


def echoed_params(body: ResponseCreateRequest) -> dict[str, Any]:
    """What the response object repeats of its request."""
    choice = body.tool_choice
    return {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "text": body.text.model_dump(by_alias=True, exclude_none=True) if body.text else DEFAULT_TEXT,
        "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
        "tool_choice": choice.model_dump() if isinstance(choice, BaseModel) else (choice or "auto"),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "user": body.user,
        "top_logprobs": body.top_logprobs,
        "max_tool_calls": body.max_tool_calls,
        "conversation": body.conversation.model_dump() if body.conversation else None,
    }


def responses_params() -> AbstractContextManager[None]:
    """A 400 the chat path raises names the caller's field (`input`, `text.format`, ...), not chat's."""
    return callers_params(CHAT_PARAMS)


def _chat_tool(function: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {key: value for key, value in function.items() if value is not None}}


def _chat_tool_choice(choice: ToolChoice | None) -> str | dict[str, Any] | None:
    if isinstance(choice, FunctionToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    if isinstance(choice, AllowedToolsToolChoice):
        tools = [{"type": "function", "function": {"name": tool.name}} for tool in choice.tools]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.mode, "tools": tools}}
    return choice


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    text_format = text.format if text else None
    if isinstance(text_format, TextFormatJsonObject):
        return {"type": "json_object"}
    if isinstance(text_format, TextFormatJsonSchema):
        body = text_format.model_dump(by_alias=True, exclude_none=True, exclude={"type"})
        return {"type": "json_schema", "json_schema": body}
    return None
