"""The Messages API's pure parts: request bodies (strict at the top level, lenient inside blocks, unreadable blocks
refused), blocks as the chat messages that run them, and replies, streamed and stored, in Anthropic's shape."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from api.errors import APIError, validation_error_info
from api.messages.conversion import TOOL_ERROR_MARK, chat_request, messages_params
from api.messages.events import MessageEvents
from api.messages.objects import error_body, message_object
from api.messages.schemas import MessageCountTokensRequest, MessageCreateRequest
from tasks.messages.generation import ErrorInfo, EventType, FinishReason, StreamEvent, Usage, UsageDetails
from tasks.messages.tool_calls import HERMES, ToolCall, call_id
from tasks.store.models import RequestRecord, RequestStatus, ResultRecord

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}


def stored(text: str, finish_reason: FinishReason, chat_body: dict[str, Any], cached: int = 0) -> RequestRecord:
    status = RequestStatus.COMPLETED.value
    request = RequestRecord(id="chatcmpl-1", tenant="a", endpoint="chat.completions", model="tiny", status=status,
                            body=chat_body, prompt_tokens=5, created=1)  # fmt: skip
    request.result = ResultRecord(request_id="chatcmpl-1", text=text, finish_reason=finish_reason.value,
                                  completion_tokens=3, usage_details={"cached_tokens": cached},
                                  finished_at=datetime.now(timezone.utc))  # fmt: skip
    return request


def translated(record: RequestRecord, stream: list[StreamEvent]) -> list[dict[str, Any]]:
    events = MessageEvents(record, record.body.get("stop") or [])
    typed = events.opening()
    for event in stream:
        typed += events.translate(event)
    return typed


def final(finish_reason: FinishReason, cached: int = 0) -> StreamEvent:
    usage = Usage(5, 3, UsageDetails(cached_tokens=cached))
    return StreamEvent(EventType.FINAL, finish_reason=finish_reason, usage=usage)


def assembled(typed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a client assembles of the content blocks (the SDK's accumulation, in short)."""
    blocks: list[dict[str, Any]] = []
    for event in typed:
        if event["type"] == "content_block_start":
            blocks.append({**event["content_block"], "json": ""})
        elif event["type"] == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                blocks[event["index"]]["text"] += delta["text"]
            else:
                blocks[event["index"]]["json"] += delta["partial_json"]
    for block in blocks:
        arguments = block.pop("json")
        if block["type"] == "tool_use":
            block["input"] = json.loads(arguments)
    return blocks


def test_a_stop_sequence_is_taken_off_and_reported_alike_streamed_and_stored() -> None:
    record = stored("a red hatEND", FinishReason.STOP, {"stop": ["END", "x"]}, cached=2)
    stream = [StreamEvent(EventType.START), StreamEvent(EventType.DELTA, text="a red"),
              StreamEvent(EventType.DELTA, text=" hatEND"), final(FinishReason.STOP, cached=2)]  # fmt: skip
    typed = translated(record, stream)
    assert [event["type"] for event in typed] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    message = message_object(record, HERMES)
    assert assembled(typed) == message["content"] == [{"type": "text", "text": "a red hat"}]
    delta = typed[-2]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    usage = {"input_tokens": 3, "output_tokens": 3, "cache_creation_input_tokens": None, "cache_read_input_tokens": 2}
    assert delta["usage"] == message["usage"] == usage
    assert message["id"] == typed[0]["message"]["id"] == "msg_1"


def test_tool_calls_are_tool_use_blocks_streamed_and_stored() -> None:
    record = stored("ok" + CALL_TEXT, FinishReason.TOOL_CALLS, {"tools": [WEATHER]})
    call = ToolCall(call_id("chatcmpl-1:0", 0), "get_weather", '{"city": "Paris"}')
    stream = [StreamEvent(EventType.DELTA, text="ok"), StreamEvent(EventType.DELTA, tool_calls=call.delta_entries(0)),
              final(FinishReason.TOOL_CALLS)]  # fmt: skip
    typed = translated(record, stream)
    message = message_object(record, HERMES)
    expected_call = {"type": "tool_use", "id": call.id, "name": "get_weather", "input": {"city": "Paris"}}
    assert assembled(typed) == message["content"] == [{"type": "text", "text": "ok"}, expected_call]
    assert typed[-2]["delta"]["stop_reason"] == message["stop_reason"] == "tool_use"


def test_a_call_cut_by_max_tokens_keeps_the_input_it_got() -> None:
    record = stored('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', FinishReason.LENGTH,
                    {"tools": [WEATHER]})  # fmt: skip
    message = message_object(record, HERMES)
    (block,) = message["content"]
    assert block["input"] == {"city": "Par"} and message["stop_reason"] == "max_tokens"


def test_an_error_while_streaming_is_anthropics_error_event() -> None:
    record = stored("", FinishReason.STOP, {})
    error = StreamEvent(EventType.FINAL, error=ErrorInfo("The engine failed.", "server_error"))
    typed = translated(record, [error])
    assert typed[-1] == {"type": "error", "error": {"type": "api_error", "message": "The engine failed."}}
    assert error_body(401, "no key")["error"]["type"] == "authentication_error"


def test_blocks_become_the_chat_messages_that_run_them() -> None:
    history = [
        {"role": "user", "content": [{"type": "text", "text": "weather?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "let me see"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny", "is_error": False},
            {"type": "text", "text": "and tomorrow?"}]},
        {"role": "assistant", "content": "Tomorrow"},
    ]  # fmt: skip
    request = MessageCreateRequest.model_validate(body(system="be brief", messages=history, tools=[WEATHER]))
    chat = chat_request(request)
    assert [(m.role, m.text) for m in chat.messages] == [
        ("system", "be brief"), ("user", "weather?"), ("assistant", "let me see"), ("tool", "sunny"),
        ("user", "and tomorrow?"), ("assistant", "Tomorrow"),
    ]  # fmt: skip
    call = chat.messages[2].tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name, call.function.arguments) == ("toolu_1", "get_weather", '{"city": "Rome"}')
    assert chat.messages[3].tool_call_id == "toolu_1"
    assert chat.continue_final_message and not chat.add_generation_prompt  # the final assistant turn is continued
    assert chat.tools[0].function.parameters == WEATHER["input_schema"]  # type: ignore[index]


def test_consecutive_messages_of_a_role_are_one_turn() -> None:
    """As Anthropic combines them: two user messages, then two assistant ones (a call, then its text), are the same
    chat messages as one message of each with their blocks in order."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}}
    split = [
        {"role": "user", "content": "weather"}, {"role": "user", "content": [{"type": "text", "text": " in Rome?"}]},
        {"role": "assistant", "content": "let me see"}, {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        {"role": "user", "content": "thanks"},
    ]  # fmt: skip
    joined = [
        {"role": "user", "content": [{"type": "text", "text": "weather"}, {"type": "text", "text": " in Rome?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "let me see"}, call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "thanks"}]},
    ]  # fmt: skip
    as_split, as_joined = (
        chat_request(MessageCreateRequest.model_validate(body(messages=history, tools=[WEATHER])))
        for history in (split, joined)
    )
    assert as_split.model_dump() == as_joined.model_dump()
    assert [(m.role, m.text) for m in as_split.messages] == [
        ("user", "weather in Rome?"), ("assistant", "let me see"), ("tool", "sunny"), ("user", "thanks"),
    ]  # fmt: skip


def test_a_failed_calls_result_is_shown_as_an_error() -> None:
    results = [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": True},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "sunny", "is_error": False},
    ]
    calls = [{"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather", "input": {"city": "X"}} for i in (1, 2)]
    history = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": calls},
               {"role": "user", "content": results}]  # fmt: skip
    chat = chat_request(MessageCreateRequest.model_validate(body(messages=history, tools=[WEATHER])))
    assert [m.text for m in chat.messages if m.role == "tool"] == [f"{TOOL_ERROR_MARK}no such city", "sunny"]


def test_tool_choice_and_sampling_are_chats() -> None:
    choices = {"auto": "auto", "any": "required", "none": "none"}
    for kind, chat_choice in choices.items():
        request = MessageCreateRequest.model_validate(body(tools=[WEATHER], tool_choice={"type": kind}))
        assert chat_request(request).tool_choice == chat_choice
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    named = body(tools=[WEATHER], tool_choice=choice, stop_sequences=["END"], top_k=5, metadata={"user_id": "u1"})
    chat = chat_request(MessageCreateRequest.model_validate(named))
    assert chat.tool_choice.function.name == "get_weather" and chat.parallel_tool_calls is False  # type: ignore[union-attr]
    assert (chat.stop, chat.include_stop_str_in_output, chat.top_k, chat.user) == (["END"], True, 5, "u1")
    counted = chat_request(MessageCountTokensRequest.model_validate({"model": "tiny", "messages": body()["messages"]}))
    assert counted.max_tokens is None and counted.add_generation_prompt


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"frequency_penalty": 1.0}, "frequency_penalty", "Unrecognized request argument"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content",
         "'image' block"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking.type", "does not think"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice", "names a tool"),
        ({"temperature": 1.5}, "temperature", "less than or equal to 1"),
        ({"tools": [{"name": "f", "input_schema": {}}]}, "tools.0.input_schema", '"type": "object"'),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
         "messages.0", "assistant messages"),
    ],
)  # fmt: skip
def test_bad_bodies_name_their_field(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(ValidationError) as raised:
        MessageCreateRequest.model_validate(body(**fields))
    info = validation_error_info(raised.value)  # the 400 the api answers
    assert info.param == param and words in info.message
    with pytest.raises(ValidationError):
        MessageCreateRequest.model_validate({key: value for key, value in body().items() if key != "max_tokens"})


def test_the_chat_paths_errors_name_the_callers_fields() -> None:
    with pytest.raises(APIError) as raised, messages_params():
        raise APIError(400, "tools.0.function.parameters: not a schema", param="tools.0.function.parameters")
    assert raised.value.info.param == "tools.0.input_schema" and str(raised.value).startswith("tools.0.input_schema")
    with pytest.raises(APIError) as raised, messages_params():
        raise APIError(400, "too long", param="max_completion_tokens")
    assert raised.value.info.param == "max_tokens"
    call = {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}
    final_call = [{"role": "assistant", "content": [call]}]
    with pytest.raises(APIError) as raised, messages_params():
        chat_request(MessageCreateRequest.model_validate(body(messages=final_call, tools=[WEATHER])))
    assert raised.value.info.param == "messages"
