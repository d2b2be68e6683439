"""The Responses API's pure parts: typed events made from a request's stream events (in order, numbered, the same
on a replay), and input items as the chat messages that run them."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from api.errors import APIError
from api.responses.conversation import chat_messages, responses_params
from api.responses.events import ResponseEvents
from api.responses.schemas import INPUT_ITEMS
from tasks.messages.generation import EventType, FinishReason, StreamEvent
from tasks.messages.response_objects import output_items
from tasks.messages.tool_calls import HERMES, ToolCall, call_id
from tasks.store.models import RequestRecord, RequestStatus, ResultRecord
from tasks.store.response_models import ResponseRecord

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def stored(text: str, finish_reason: FinishReason, status: RequestStatus = RequestStatus.COMPLETED) -> ResponseRecord:
    request = RequestRecord(id="chatcmpl-1", tenant="a", endpoint="chat.completions", model="tiny",
                            status=status.value, body={}, prompt_tokens=5, created=1)  # fmt: skip
    request.result = ResultRecord(request_id="chatcmpl-1", text=text, finish_reason=finish_reason.value,
                                  completion_tokens=3, finished_at=datetime.now(timezone.utc))  # fmt: skip
    return ResponseRecord(id="resp_1", tenant="a", request_id="chatcmpl-1", created_at=1, store=True, background=False,
                          input_items=[], params={}, request=request)  # fmt: skip


def translated(record: ResponseRecord, stream: list[StreamEvent]) -> list[dict]:
    events = ResponseEvents(record, HERMES, lambda: record)
    typed = events.opening()
    for event in stream:
        typed += events.translate(event)
    return typed


def text_stream(*pieces: str, finish_reason: FinishReason = FinishReason.STOP) -> list[StreamEvent]:
    deltas = [StreamEvent(EventType.DELTA, text=piece) for piece in pieces]
    return [StreamEvent(EventType.START), *deltas, StreamEvent(EventType.FINAL, finish_reason=finish_reason)]


def test_text_events_come_in_order_and_assemble_to_the_stored_text() -> None:
    record = stored("a red hat", FinishReason.STOP)
    typed = translated(record, text_stream("a red", " hat"))
    assert [event["type"] for event in typed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in typed] == list(range(len(typed)))
    assert typed[6]["text"] == "a red hat" and typed[8]["item"] == typed[-1]["response"]["output"][0]
    assert typed[2]["item"]["id"] == typed[-1]["response"]["output"][0]["id"]  # the same item, streamed or stored


def test_a_replay_numbers_every_event_alike() -> None:
    record = stored("a red hat", FinishReason.LENGTH)
    stream = text_stream("a red", " hat", finish_reason=FinishReason.LENGTH)
    assert translated(record, stream) == translated(record, stream)
    assert translated(record, stream)[-1]["type"] == "response.incomplete"


def test_a_call_streams_as_a_function_call_item_with_its_argument_events() -> None:
    record = stored(CALL_TEXT, FinishReason.TOOL_CALLS)
    call = ToolCall(call_id("chatcmpl-1:0", 0), "get_weather", '{"city": "Paris"}')
    stream = [StreamEvent(EventType.START), StreamEvent(EventType.DELTA, tool_calls=call.delta_entries(0)),
              StreamEvent(EventType.FINAL, finish_reason=FinishReason.TOOL_CALLS)]  # fmt: skip
    typed = translated(record, stream)
    assert [event["type"] for event in typed[2:]] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done_item = typed[5]["item"]
    assert done_item == output_items(record, HERMES)[0] == typed[-1]["response"]["output"][0]
    assert (done_item["call_id"], done_item["arguments"]) == (call.id, '{"city": "Paris"}')


def test_calls_follow_their_assistant_turn_and_outputs_become_tool_messages() -> None:
    items = INPUT_ITEMS.validate_python([
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ])  # fmt: skip
    messages = chat_messages("be brief", items)
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "tool"]
    assert [call["id"] for call in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


@pytest.mark.parametrize(
    ("chat_param", "param"),
    [("messages", "input"), ("max_tokens", "max_output_tokens"), ("tools.2.function.parameters", "tools.2.parameters"),
     ("response_format.json_schema.schema", "text.format.schema"), ("tool_choice", "tool_choice")],
)  # fmt: skip
def test_a_chat_path_error_names_the_callers_field(chat_param: str, param: str) -> None:
    with pytest.raises(APIError) as raised, responses_params():
        raise APIError(400, f"{chat_param} is wrong", param=chat_param)
    assert (raised.value.info.param, str(raised.value)) == (param, f"{param} is wrong")
