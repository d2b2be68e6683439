"""The Responses API through the whole stack with the `openai` client: plain, streamed and background responses
(resumed after a sequence number), stored conversations, store false, tools and text formats, and cancel."""

from __future__ import annotations

import json
import time

import jsonschema
import openai
import pytest
import sqlalchemy

from scripts.stack import Stack
from tests.service.batch_helpers import client_for

pytestmark = pytest.mark.postgres  # on both databases: stored responses and their chains are SQL rows

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Get the weather.", "parameters": CITY}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
# Forces a long reply (each item is at least two tokens), so a cancel finds it running.
LONG_REPLY = {"type": "array", "items": {"type": "integer"}, "minItems": 600}


def ended(stack: Stack, response_id: str, timeout_s: float = 120.0) -> openai.types.responses.Response:
    client, deadline = client_for(stack), time.monotonic() + timeout_s
    while (response := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"{response_id} did not end"
        time.sleep(0.2)
    return response


def rows_of(stack: Stack, response_id: str, request_id_like: str) -> tuple[int, int]:
    """(responses rows with this id, requests rows whose body holds `request_id_like`)."""
    engine = sqlalchemy.create_engine(stack.config.database_url)
    try:
        with engine.connect() as connection:
            responses = connection.execute(
                sqlalchemy.text("SELECT COUNT(*) FROM responses WHERE id = :id"), {"id": response_id}
            ).scalar_one()
            requests = connection.execute(
                sqlalchemy.text("SELECT COUNT(*) FROM requests WHERE CAST(body AS TEXT) LIKE :pattern"),
                {"pattern": f"%{request_id_like}%"},
            ).scalar_one()
        return responses, requests
    finally:
        engine.dispose()


def test_a_response_says_what_chat_says(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    response = client.responses.create(
        model=model, input="name a color", instructions="be brief", max_output_tokens=12, temperature=0
    )
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a color"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.output_text == chat.choices[0].message.content
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    if response.status == "incomplete":
        assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].type == "message" and response.output[0].content[0].type == "output_text"
    assert response.usage is not None and response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.instructions == "be brief" and response.max_output_tokens == 12 and response.store is True
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_a_streamed_response_sends_typed_events_in_order(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    events = list(client.responses.create(model=model, input="name a color", max_output_tokens=16, stream=True))
    types = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert [t for t in types if t != "response.output_text.delta"] == [*TEXT_EVENTS, types[-1]]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert types.count("response.output_text.delta") >= 1
    final = events[-1].response
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == final.output_text
    assert events[0].response.id == final.id and final.usage is not None
    with client.responses.stream(model=model, input="name a color", max_output_tokens=16, temperature=0) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        assert stream.get_final_response().output_text == streamed


def test_a_background_response_resumes_after_a_sequence_number(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    started = client.responses.create(model=model, input="tell me about cats", max_output_tokens=32, background=True)
    assert started.background is True and started.status in ("queued", "in_progress", "completed", "incomplete")
    full = list(client.responses.retrieve(started.id, stream=True))
    assert [event.sequence_number for event in full] == list(range(len(full)))
    for after in (0, 3, len(full) // 2, len(full) - 2):
        tail = list(client.responses.retrieve(started.id, stream=True, starting_after=after))
        assert [e.model_dump() for e in tail] == [e.model_dump() for e in full[after + 1 :]]
    finished = ended(stack, started.id)
    assert finished.output_text == "".join(e.delta for e in full if e.type == "response.output_text.delta")
    assert full[-1].response.output_text == finished.output_text


def test_previous_response_id_continues_the_conversation(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    first = client.responses.create(model=model, input="my name is Ann", max_output_tokens=8, temperature=0)
    second = client.responses.create(
        model=model, previous_response_id=first.id, input="what is my name?", max_output_tokens=8, temperature=0
    )
    assert second.previous_response_id == first.id
    messages = [
        {"role": "user", "content": "my name is Ann"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "what is my name?"},
    ]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    assert second.output_text == chat.choices[0].message.content
    assert chat.usage is not None and second.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens


def test_store_false_keeps_nothing(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    marker = f"remember {time.time_ns()}"
    response = client.responses.create(model=model, input=marker, max_output_tokens=4, store=False)
    assert response.store is False and response.status in ("completed", "incomplete")
    assert rows_of(stack, response.id, marker) == (0, 0)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model=model, input="and?", previous_response_id=response.id)
    assert raised.value.body["param"] == "previous_response_id"
    streamed_marker = f"stream {time.time_ns()}"
    events = list(client.responses.create(model=model, input=streamed_marker, store=False, stream=True))
    assert rows_of(stack, events[-1].response.id, streamed_marker) == (0, 0)


def test_tools_make_function_calls_that_the_next_turn_takes(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    response = client.responses.create(
        model=model, input="weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required", max_output_tokens=80
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" and call.call_id.startswith("call_") for call in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), CITY)
    outputs = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"} for call in calls]
    answer = client.responses.create(
        model=model, previous_response_id=response.id, input=outputs, tools=[WEATHER_TOOL], max_output_tokens=8
    )
    assert answer.status in ("completed", "incomplete")
    given_back = [call.model_dump(include={"type", "call_id", "name", "arguments"}) for call in calls]
    history = [{"role": "user", "content": "weather in Paris?"}, *given_back, *outputs]
    replayed = client.responses.create(model=model, input=history, max_output_tokens=4)
    assert replayed.status in ("completed", "incomplete")


def test_a_streamed_function_call_sends_its_argument_events(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    named = {"type": "function", "name": "get_weather"}
    events = list(
        client.responses.create(
            model=model, input="weather?", tools=[WEATHER_TOOL], tool_choice=named, max_output_tokens=80, stream=True
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(done) == 1 and "".join(d.delta for d in deltas) == done[0].arguments
    final_calls = [item for item in events[-1].response.output if item.type == "function_call"]
    assert [(c.id, c.arguments) for c in final_calls] == [(done[0].item_id, done[0].arguments)]
    jsonschema.validate(json.loads(done[0].arguments), CITY)


def test_text_format_json_schema_gives_valid_json(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    text_format = {"type": "json_schema", "name": "place", "schema": CITY, "strict": True}
    response = client.responses.create(
        model=model, input="a city as JSON", text={"format": text_format}, max_output_tokens=60, temperature=0
    )
    jsonschema.validate(json.loads(response.output_text), CITY)
    assert response.text.format.type == "json_schema"
    as_object = client.responses.create(
        model=model, input="JSON please", text={"format": {"type": "json_object"}}, max_output_tokens=60
    )
    assert as_object.output_text.startswith("{")  # an object, though its strings may outrun the token budget
    if as_object.status == "completed":
        assert isinstance(json.loads(as_object.output_text), dict)


def test_a_background_response_can_be_cancelled(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    text_format = {"type": "json_schema", "name": "numbers", "schema": LONG_REPLY}
    started = client.responses.create(
        model=model, input="count", text={"format": text_format}, max_output_tokens=4000, background=True
    )
    cancelled = client.responses.cancel(started.id)
    assert cancelled.id == started.id
    assert ended(stack, started.id).status == "cancelled"
    events = list(client.responses.retrieve(started.id, stream=True))
    assert events[-1].response.status == "cancelled"
    client.responses.delete(started.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(started.id)
