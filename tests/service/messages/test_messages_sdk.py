"""Anthropic's Messages API as the `anthropic` SDK calls it, against the real stack: each reply is checked against the
chat completion the same conversation gets at temperature 0 (the same engine path), and each token count against the
served model's own chat template, not against what the tiny model's weights happen to say."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema
import pytest
import requests
from transformers import AutoTokenizer

from scripts.stack import Stack
from tests.service.batch_helpers import client_for
from tests.service.http import auth
from tests.service.steering import test_steering
from tests.service.steering.test_steering import SAE_ID
from tests.service.structured.test_structured_outputs import SCHEMA_OF, TOOLS

SYSTEM = "be brief"
QUESTION = "name a color"
GREEDY = {"temperature": 0}
ANTHROPIC_TOOLS = [
    {"name": tool["function"]["name"], "description": tool["function"]["description"],
     "input_schema": tool["function"]["parameters"]}
    for tool in TOOLS
]  # fmt: skip


def anthropic_client(stack: Stack, **auth: Any) -> anthropic.Anthropic:
    """Sends the stack's admin key as `x-api-key`, as the SDK does, unless `auth` says otherwise."""
    auth = auth or {"api_key": stack.api_key}
    return anthropic.Anthropic(base_url=stack.base_url, max_retries=0, timeout=120, **auth)


def chat_reference(stack: Stack, messages: list[dict], max_tokens: int, **body: Any) -> Any:
    reply = client_for(stack).chat.completions.create(
        model=stack.config.model_name, messages=messages, max_tokens=max_tokens, temperature=0, **body  # type: ignore[arg-type]
    )  # fmt: skip
    return reply


def template_count(stack: Stack, messages: list[dict], tools: list[dict]) -> int:
    """The prompt's tokens as the served model's own chat template renders the chat conversation, tools offered."""
    tokenizer = AutoTokenizer.from_pretrained(stack.config.model)
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(text, add_special_tokens=False))


def ask(stack: Stack, **body: Any) -> anthropic.types.Message:
    """Greedy: the SDK no longer has `temperature` among its arguments; the API takes it, as older SDKs send it."""
    asked: dict[str, Any] = {"model": stack.config.model_name, "max_tokens": 8, "extra_body": GREEDY}
    return anthropic_client(stack).messages.create(**{**asked, **body})


def test_a_message_is_the_chat_reply(stack: Stack) -> None:
    message = ask(stack, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}])
    chat = chat_reference(stack, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], 8)
    choice = chat.choices[0]
    expected_text = choice.message.content or ""
    assert [block.model_dump() for block in message.content] == (
        [{"type": "text", "text": expected_text, "citations": None}] if expected_text else []
    )
    assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[choice.finish_reason]
    assert message.id.startswith("msg_") and message.role == "assistant" and message.stop_sequence is None
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens


def test_count_tokens_is_the_prompt_that_runs(stack: Stack) -> None:
    cached = {"type": "text", "text": "another", "cache_control": {"type": "ephemeral"}}  # ignored, as a hint
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "red"},
                {"role": "user", "content": [cached]}]  # fmt: skip
    counted = anthropic_client(stack).messages.count_tokens(
        model=stack.config.model_name, system=SYSTEM, messages=messages, tools=ANTHROPIC_TOOLS  # type: ignore[arg-type]
    )  # fmt: skip
    chat_messages = [{"role": "system", "content": SYSTEM}, *messages[:2], {"role": "user", "content": "another"}]
    assert counted.input_tokens == template_count(stack, chat_messages, TOOLS)


def test_a_stream_assembles_to_the_message(stack: Stack) -> None:
    body: dict[str, Any] = {"model": stack.config.model_name, "max_tokens": 12, "extra_body": GREEDY,
                            "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
    message = anthropic_client(stack).messages.create(**body)
    with anthropic_client(stack).messages.stream(**body) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert [block.model_dump() for block in streamed.content] == [block.model_dump() for block in message.content]
    assert streamed.stop_reason == message.stop_reason
    assert streamed.usage.output_tokens == message.usage.output_tokens
    total = streamed.usage.input_tokens + (streamed.usage.cache_read_input_tokens or 0)
    assert total == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_stop_sequences_end_the_reply(stack: Stack) -> None:
    messages = [{"role": "user", "content": QUESTION}]
    full = chat_reference(stack, messages, 16).choices[0].message.content or ""
    assert len(full) >= 4, f"the reference reply {full!r} is too short to hold a stop sequence"
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    expected = full[: full.index(stop)]
    message = ask(stack, messages=messages, max_tokens=16, stop_sequences=[stop, "never-said-stop"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert "".join(block.text for block in message.content if block.type == "text") == expected
    body = {"model": stack.config.model_name, "max_tokens": 16, "extra_body": GREEDY, "messages": messages,
            "stop_sequences": [stop]}  # fmt: skip
    with anthropic_client(stack).messages.stream(**body) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "stop_sequence" and streamed.stop_sequence == stop
    assert [block.model_dump() for block in streamed.content] == [block.model_dump() for block in message.content]


def test_a_tool_round_trip(stack: Stack) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "what is the weather in Rome?"}]
    asked = {"messages": messages, "tools": ANTHROPIC_TOOLS, "max_tokens": 80}
    first = ask(stack, **asked, tool_choice={"type": "tool", "name": "get_weather"})
    calls = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use" and calls and all(call.name == "get_weather" for call in calls)
    for call in calls:
        jsonschema.validate(call.input, SCHEMA_OF["get_weather"])
    with anthropic_client(stack).messages.stream(
        model=stack.config.model_name, extra_body=GREEDY, tool_choice={"type": "tool", "name": "get_weather"}, **asked
    ) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert [block.model_dump(exclude={"id"}) for block in streamed.content] == [
        block.model_dump(exclude={"id"}) for block in first.content
    ]  # each request names its calls
    results = [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "sunny"}]}
               for call in calls]  # fmt: skip
    history = [*messages, {"role": "assistant", "content": [block.model_dump() for block in first.content]},
               {"role": "user", "content": results}]  # fmt: skip
    second = ask(stack, messages=history, tools=ANTHROPIC_TOOLS, max_tokens=8)
    chat_calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.input}}
                  for call in calls]  # fmt: skip
    chat_results = [{"role": "tool", "tool_call_id": call.id, "content": "sunny"} for call in calls]
    chat_history = [*messages, {"role": "assistant", "content": "", "tool_calls": chat_calls}, *chat_results]
    expected = template_count(stack, chat_history, TOOLS)
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) == expected
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_any_tool_choice_calls_an_offered_tool(stack: Stack) -> None:
    message = ask(stack, messages=[{"role": "user", "content": "add 3 and 4"}], tools=ANTHROPIC_TOOLS,
                  tool_choice={"type": "any", "disable_parallel_tool_use": True}, max_tokens=80)  # fmt: skip
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use"
    jsonschema.validate(call.input, SCHEMA_OF[call.name])


def test_errors_in_anthropics_shape(stack: Stack) -> None:
    client, model = anthropic_client(stack), stack.config.model_name
    user = [{"role": "user", "content": QUESTION}]
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=model, max_tokens=4, messages=user, extra_body={"frequency_penalty": 1})  # type: ignore[arg-type]
    assert raised.value.body["type"] == "error"  # type: ignore[index]
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "frequency_penalty" in raised.value.body["error"]["message"]  # type: ignore[index]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [image]}])  # type: ignore[list-item]
    assert "messages.0.content" in raised.value.message and "'image' block" in raised.value.message
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model=model, max_tokens=10**9, messages=user)  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=4, messages=user)  # type: ignore[arg-type]
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic_client(stack, api_key="sk-wrong").messages.create(model=model, max_tokens=4, messages=user)  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


served, blue = test_steering.served, test_steering.blue  # the fixtures the steering tests use


def test_steering_fields_steer_the_message(served: Stack, blue: dict) -> None:
    """Steering as chat takes it, a top-level field, and its report; the key sent as `Authorization: Bearer`."""
    steering = {"sae_id": SAE_ID, "features": [{"index": blue["index"], "strength": blue["strength"]}]}
    messages = [{"role": "user", "content": QUESTION}]
    message = anthropic_client(served, auth_token=served.api_key).messages.create(
        model=served.config.model_name, max_tokens=8, messages=messages,  # type: ignore[arg-type]
        extra_body={**GREEDY, "steering": steering},
    )  # fmt: skip
    chat = chat_reference(served, messages, 8, extra_body={"steering": steering})
    assert "".join(block.text for block in message.content if block.type == "text") == chat.choices[0].message.content
    assert message.model_extra is not None and chat.model_extra is not None
    assert message.model_extra["steering"] == chat.model_extra["steering"]


def test_a_message_is_its_request(stack: Stack) -> None:
    """A message's id names the request it ran as: GET /v1/requests/chatcmpl-<hex> reads it."""
    message = ask(stack, messages=[{"role": "user", "content": QUESTION}])
    request_id = "chatcmpl-" + message.id.removeprefix("msg_")
    response = requests.get(f"{stack.base_url}/v1/requests/{request_id}", headers=auth(stack), timeout=30)
    assert response.status_code == 200 and response.json()["status"] == "completed"


def test_the_raw_stream_names_each_event_by_its_type(stack: Stack) -> None:
    """Over plain HTTP, with the headers Anthropic's clients send: `event:` is each data's `type`; a ping follows
    message_start."""
    body = {"model": stack.config.model_name, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": QUESTION}]}  # fmt: skip
    headers = {"x-api-key": stack.api_key or "", "anthropic-version": "2023-06-01"}
    url = f"{stack.base_url}/v1/messages"
    with requests.post(url, json=body, headers=headers, stream=True, timeout=120) as response:
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        text = response.text
    pairs = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        pairs.append((fields["event"], json.loads(fields["data"])))
    assert all(data["type"] == event for event, data in pairs)
    kinds = [event for event, _ in pairs]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
