"""A Messages API request as the chat request that runs it: the system prompt and the messages' blocks become chat
messages (consecutive messages of one role merged into one turn, tool_use blocks an assistant's tool_calls,
tool_result blocks tool messages, a failed call's result marked as an error), tools and tool_choice become
chat's, so the chat path's templates, grammars, tool parsing, steering and admission serve both. A conversation that
ends with an assistant message has that message continued (Anthropic's prefill).

`stop_sequences` run as chat's `stop` with `include_stop_str_in_output`: the text then ends with the stop sequence
that ended it, which the reply (api/messages/objects.py) takes off and reports as `stop_sequence`."""

from __future__ import annotations

import json
import re
from contextlib import AbstractContextManager
from typing import Any

from api.chat.param_names import callers_params
from api.chat.schemas import ChatCompletionRequest
from api.errors import APIError
from api.messages.schemas import (
    MessageCreateRequest,
    MessageParam,
    MessagesInput,
    TextBlock,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)

# Where the chat path names a field of the chat request, the caller sent this field of theirs.
CHAT_PARAMS = (
    (re.compile(r"^tools\.(\d+)\.function\.parameters"), r"tools.\1.input_schema"),
    (re.compile(r"^max_(completion_)?tokens$"), "max_tokens"),
    (re.compile(r"^stop$"), "stop_sequences"),
)
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
TOOL_ERROR_MARK = "Error: "  # what a tool_result with is_error: true starts with, as the model reads it


def messages_params() -> AbstractContextManager[None]:
    """A 400 the chat path raises names the caller's field (`max_tokens`, `tools.0.input_schema`, ...)."""
    return callers_params(CHAT_PARAMS)


def chat_request(body: MessagesInput) -> ChatCompletionRequest:
    """The chat request for `body`; a count_tokens body gives one that is only rendered, never run."""
    chat: dict[str, Any] = {"model": body.model, "messages": chat_messages(body.system, body.messages)}
    if body.tools:
        chat["tools"] = [_chat_tool(tool.name, tool.description, tool.input_schema) for tool in body.tools]
    if body.tool_choice is not None:
        chat.update(_chat_tool_choice(body.tool_choice))
    if body.messages[-1].role == "assistant":
        chat.update(add_generation_prompt=False, continue_final_message=True)
    if isinstance(body, MessageCreateRequest):
        chat.update(_sampling(body))
    return ChatCompletionRequest.model_validate(chat)


def chat_messages(system: list[TextBlock] | None, messages: list[MessageParam]) -> list[dict[str, Any]]:
    rendered: list[dict[str, Any]] = [{"role": "system", "content": _text_parts(system)}] if system else []
    messages = merged_turns(messages)
    for index, message in enumerate(messages):
        if message.role == "assistant":
            rendered.append(_assistant_message(message, is_final=index == len(messages) - 1))
        else:
            rendered.extend(_user_messages(message))
    return rendered


def merged_turns(messages: list[MessageParam]) -> list[MessageParam]:
    """Consecutive messages of one role are one turn, their blocks in order, as Anthropic combines them."""
    turns: list[MessageParam] = []
    for message in messages:
        if turns and turns[-1].role == message.role:
            turns[-1] = MessageParam.model_construct(role=message.role, content=turns[-1].content + message.content)
        else:
            turns.append(message)
    return turns


def _assistant_message(message: MessageParam, is_final: bool) -> dict[str, Any]:
    calls = [
        {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": json.dumps(block.input)}}
        for block in message.content
        if isinstance(block, ToolUseBlock)
    ]
    if calls and is_final:
        message_text = "a final assistant message is continued, so it cannot end in tool_use blocks: send their "
        raise APIError(400, message_text + "tool_result blocks in a user message", param="messages")
    rendered: dict[str, Any] = {"role": "assistant", "content": _text_parts(message.content)}
    if calls:
        rendered["tool_calls"] = calls
    return rendered


def _user_messages(message: MessageParam) -> list[dict[str, Any]]:
    """Each tool_result a tool message, in order; the text blocks between them a user message."""
    rendered: list[dict[str, Any]] = []
    texts: list[TextBlock] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            if texts:
                rendered.append({"role": "user", "content": _text_parts(texts)})
                texts = []
            rendered.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": _tool_result_parts(block)})
        elif isinstance(block, TextBlock):
            texts.append(block)
    if texts or not rendered:
        rendered.append({"role": "user", "content": _text_parts(texts)})
    return rendered


def _tool_result_parts(block: ToolResultBlock) -> list[dict[str, str]]:
    """A result marked `is_error` opens with TOOL_ERROR_MARK, so the model reads that the call failed."""
    parts = _text_parts(block.content)
    return [{"type": "text", "text": TOOL_ERROR_MARK}, *parts] if block.is_error else parts


def _text_parts(blocks: list[Any]) -> list[dict[str, str]]:
    """The text blocks among `blocks`, as chat's text parts (joined as chat joins them)."""
    return [{"type": "text", "text": block.text} for block in blocks if isinstance(block, TextBlock)]


def _chat_tool(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "parameters": schema}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: ToolChoice) -> dict[str, Any]:
    """`disable_parallel_tool_use` is chat's `parallel_tool_calls: false`."""
    chat: dict[str, Any] = {}
    if choice.type == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        chat["tool_choice"] = TOOL_CHOICES[choice.type]
    if choice.disable_parallel_tool_use:
        chat["parallel_tool_calls"] = False
    return chat


def _sampling(body: MessageCreateRequest) -> dict[str, Any]:
    sampling: dict[str, Any] = {"max_tokens": body.max_tokens, "temperature": body.temperature}
    optional = {
        "top_p": body.top_p,
        "top_k": body.top_k,
        "steering": body.steering,
        "monitor": body.monitor,
        "user": body.metadata.user_id if body.metadata else None,
    }
    sampling.update({name: value for name, value in optional.items() if value is not None})
    if body.stop_sequences:
        sampling.update(stop=body.stop_sequences, include_stop_str_in_output=True)
    return sampling
