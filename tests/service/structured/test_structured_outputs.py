"""Structured outputs and tool calls through the whole stack with the `openai` client: replies validate against
their schemas, forced calls parse and their arguments validate, streams assemble to the non-streamed reply, the
tiny model's own calls are parsed in auto mode, and batch lines carry all of it."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests

from scripts.stack import Stack
from tasks.messages.tool_calls import parse_reply
from tests.api.structured.test_structured_validation import HISTORY, LANGCHAIN_STRUCTURED, LANGCHAIN_TOOLS
from tests.service.batch_helpers import chat_line, client_for, read_jsonl, submit, wait_for_end
from tests.service.http import auth

NAME = {"type": "string", "maxLength": 12}
LIKES = {"enum": ["cake", "pie", "soup"]}
PET_FIELDS = {"kind": {"enum": ["cat", "dog"]}, "young": {"type": "boolean"}}
PET = {"type": "object", "properties": PET_FIELDS, "required": ["kind"]}
SCHEMAS = [
    {  # nested object, required fields, bounded integer
        "type": "object",
        "properties": {
            "name": NAME,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "home": {"type": "object", "properties": {"city": NAME}, "required": ["city"]},
        },
        "required": ["name", "age", "home"],
    },
    {  # an array of enums
        "type": "object",
        "properties": {"likes": {"type": "array", "items": LIKES, "minItems": 1, "maxItems": 3}},
        "required": ["likes"],
    },
    {  # an array of objects, an optional field, a boolean
        "type": "object",
        "properties": {"pets": {"type": "array", "items": PET, "maxItems": 2}, "nickname": NAME},
        "required": ["pets"],
    },
]
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}
NUMBERS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the weather.", "parameters": CITY}},
    {"type": "function", "function": {"name": "add_numbers", "description": "Add numbers.", "parameters": NUMBERS}},
]
SCHEMA_OF = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def assert_calls_validate(message) -> None:  # type: ignore[no-untyped-def]
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA_OF[call.function.name])


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_replies_validate(stack: Stack, schema: dict) -> None:
    reply = client_for(stack).chat.completions.create(
        model=stack.config.model_name,
        messages=ask("describe Anna as JSON"),
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
        max_tokens=160,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_json_object_and_vllm_constraints(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    reply = client.chat.completions.create(
        model=model,
        messages=ask("describe Tom as JSON"),
        response_format={"type": "json_object"},
        max_tokens=120,
        temperature=0,
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    choice = client.chat.completions.create(
        model=model, messages=ask("is it sunny?"), max_tokens=8, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert choice.choices[0].message.content in ("yes", "no")
    code = {"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}}
    regex = client.completions.create(model=model, prompt="Her code is", max_tokens=12, extra_body=code)
    assert regex.choices[0].text[:2].isupper() and regex.choices[0].text[3:].isdigit()


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add_numbers"}}])
def test_forced_calls_parse_and_their_arguments_validate(stack: Stack, tool_choice: object) -> None:
    reply = client_for(stack).chat.completions.create(
        model=stack.config.model_name,
        messages=ask("tell me about cats"),
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice=tool_choice,  # type: ignore[arg-type]
        max_tokens=80,
        temperature=0.7,
        seed=5,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == ("stop" if isinstance(tool_choice, dict) else "tool_calls")  # as OpenAI answers
    assert_calls_validate(choice.message)
    if isinstance(tool_choice, dict):
        assert [call.function.name for call in choice.message.tool_calls] == ["add_numbers"]


def test_a_streamed_reply_assembles_to_the_non_streamed_one(stack: Stack) -> None:
    client = client_for(stack)
    body = {"model": stack.config.model_name, "messages": ask("what is the weather in Rome?"), "tools": TOOLS,
            "tool_choice": "required", "max_tokens": 80, "temperature": 0.9, "seed": 11, "n": 2}  # fmt: skip
    whole = client.chat.completions.create(**body)
    with client.chat.completions.stream(**body) as stream:
        streamed = stream.get_final_completion()
    stored = requests.get(f"{stack.base_url}/v1/requests/{streamed.id}", headers=auth(stack), timeout=10).json()
    stored = stored["response"]
    for index, (whole_choice, streamed_choice) in enumerate(zip(whole.choices, streamed.choices, strict=True)):
        assert_calls_validate(streamed_choice.message)
        assert calls(streamed_choice.message.tool_calls) == calls(whole_choice.message.tool_calls)
        assert streamed_choice.finish_reason == whole_choice.finish_reason == "tool_calls"
        # the stream and the stored reply of one request name its calls alike
        stored_calls = stored["choices"][index]["message"]["tool_calls"]
        assert [call["id"] for call in stored_calls] == [call.id for call in streamed_choice.message.tool_calls]


def calls(tool_calls) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(call.function.name, call.function.arguments) for call in tool_calls]


def test_auto_mode_reads_the_models_own_text_for_calls(stack: Stack) -> None:
    """With tools offered and none forced, the reply is the model's own text read for calls: a well-formed call
    becomes tool_calls, anything else stays content. What the tiny model writes depends on the CPU that trained it,
    so the expectation is read from the reply's own tokens (its logprobs' bytes) through the configured parser."""
    client = client_for(stack)
    for question in ("what is the weather in Paris?", "what is 3 plus 4?"):
        reply = client.chat.completions.create(
            model=stack.config.model_name, messages=ask(question), tools=TOOLS, max_tokens=40, temperature=0,
            logprobs=True,
        )  # fmt: skip
        choice = reply.choices[0]
        # a reply that was not cut at max_tokens ended with its end-of-turn token, which its text leaves out
        tokens = choice.logprobs.content if choice.finish_reason == "length" else choice.logprobs.content[:-1]
        written = b"".join(bytes(entry.bytes) for entry in tokens).decode()
        is_cut = choice.finish_reason == "length"
        expected = parse_reply(stack.config.tool_call_parser, written, "call", is_cut)
        calls = choice.message.tool_calls or []
        assert [(call.function.name, call.function.arguments) for call in calls] == [
            (call.name, call.arguments) for call in expected.tool_calls
        ]
        assert choice.message.content == (expected.content if expected.tool_calls else written)
        assert choice.finish_reason == "length" if is_cut else (choice.finish_reason == "tool_calls") == bool(calls)


@pytest.mark.parametrize("body", [LANGCHAIN_STRUCTURED, LANGCHAIN_TOOLS, {"messages": HISTORY, "tools": TOOLS}])
def test_langchain_shaped_requests(stack: Stack, body: dict) -> None:
    sent = {"model": stack.config.model_name, "max_tokens": 80, "temperature": 0, **body}
    response = requests.post(f"{stack.base_url}/v1/chat/completions", json=sent, headers=auth(stack), timeout=120)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    if "response_format" in body:
        jsonschema.validate(json.loads(message["content"]), body["response_format"]["json_schema"]["schema"])
    if "tool_choice" in body:
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "get_weather" and "city" in json.loads(call["function"]["arguments"])


def test_batch_lines_carry_structured_outputs_and_tool_calls(stack: Stack) -> None:
    lines = [
        chat_line(stack, "json", "describe Anna as JSON", max_tokens=160,
                  response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS[0]}}),
        chat_line(stack, "tools", "add 3 and 4", max_tokens=80, tools=TOOLS, tool_choice="required"),
    ]  # fmt: skip
    batch = wait_for_end(stack, submit(stack, lines))
    assert batch.status == "completed", batch
    outputs = {
        line["custom_id"]: line["response"]["body"]["choices"][0] for line in read_jsonl(stack, batch.output_file_id)
    }
    jsonschema.validate(json.loads(outputs["json"]["message"]["content"]), SCHEMAS[0])
    assert outputs["tools"]["finish_reason"] == "tool_calls"
    for call in outputs["tools"]["message"]["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA_OF[call["function"]["name"]])
