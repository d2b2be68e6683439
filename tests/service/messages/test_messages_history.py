"""What the `anthropic` SDK and the tools on it send and read beyond one clean turn: histories with consecutive
messages of one role (merged, as Anthropic merges them), a failed tool call's result, and the `request-id` header the
SDK reads as `_request_id`; token counts derived from the served model's own chat template."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from api.messages.conversion import TOOL_ERROR_MARK
from scripts.stack import Stack
from tests.service.messages.test_messages_sdk import ANTHROPIC_TOOLS, QUESTION, anthropic_client, ask, template_count
from tests.service.structured.test_structured_outputs import TOOLS

CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}


def count(stack: Stack, messages: list[dict[str, Any]], **body: Any) -> int:
    counted = anthropic_client(stack).messages.count_tokens(model=stack.config.model_name, messages=messages, **body)
    return counted.input_tokens


def test_consecutive_messages_of_a_role_are_merged(stack: Stack) -> None:
    split = [{"role": "user", "content": "my name is Ann."}, {"role": "user", "content": " What is my name?"}]
    joined = [{"role": "user", "content": [{"type": "text", "text": "my name is Ann."},
                                           {"type": "text", "text": " What is my name?"}]}]  # fmt: skip
    expected = template_count(stack, [{"role": "user", "content": "my name is Ann. What is my name?"}], [])
    assert count(stack, split) == count(stack, joined) == expected
    as_split, as_joined = ask(stack, messages=split), ask(stack, messages=joined)
    assert as_split.content == as_joined.content and as_split.usage.input_tokens == expected


def test_a_failed_calls_result_reads_as_an_error(stack: Stack) -> None:
    def history(is_error: bool) -> list[dict[str, Any]]:
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": is_error}
        return [{"role": "user", "content": "weather in Rome?"}, {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [result]}]  # fmt: skip

    chat_call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": CALL["input"]}}
    chat = [
        {"role": "user", "content": "weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [chat_call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": f"{TOOL_ERROR_MARK}no such city"},
    ]
    assert count(stack, history(True), tools=ANTHROPIC_TOOLS) == template_count(stack, chat, TOOLS)
    assert count(stack, history(True), tools=ANTHROPIC_TOOLS) > count(stack, history(False), tools=ANTHROPIC_TOOLS)


def test_every_answer_carries_a_request_id(stack: Stack) -> None:
    client, model = anthropic_client(stack), stack.config.model_name
    raw = client.messages.with_raw_response.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": QUESTION}]
    )
    message = raw.parse()
    assert message._request_id and message._request_id == raw.headers["x-request-id"]
    with client.messages.stream(model=model, max_tokens=4, messages=[{"role": "user", "content": QUESTION}]) as stream:
        stream.get_final_message()
        assert stream.request_id
    counted = client.messages.with_raw_response.count_tokens(model=model, messages=[{"role": "user", "content": "x"}])
    assert counted.request_id and counted.parse()._request_id == counted.request_id
    with pytest.raises(anthropic.NotFoundError) as raised:
        client.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": QUESTION}])
    assert raised.value.request_id
    mine = anthropic_client(stack, api_key=stack.api_key, default_headers={"X-Request-Id": "trace-7"})
    assert mine.messages.count_tokens(model=model, messages=[{"role": "user", "content": "x"}])._request_id == "trace-7"
