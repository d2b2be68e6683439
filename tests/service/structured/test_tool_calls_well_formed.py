"""Tool calls are always well-formed, whatever the weights: a call the model starts in auto mode is held by the grammar
to an offered tool and its schema; an argument string may hold the end marker `</tool_call>`; a call cut off by
max_tokens comes back as a partial `tool_calls` entry with finish_reason "length", streamed and not."""

from __future__ import annotations

import json

import jsonschema

from scripts.stack import Stack
from tests.service.batch_helpers import client_for

MARKED = "a</tool_call>b"
USER = {"type": "object", "properties": {"name": {"enum": [MARKED]}, "age": {"type": "integer"}}}
USER |= {"required": ["name", "age"]}
LONG_NAME = "x" * 120  # far more tokens than the cut below allows
LONG_USER = {"type": "object", "properties": {"name": {"enum": [LONG_NAME]}}, "required": ["name"]}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def ask(stack: Stack, **body: object) -> dict:
    return {"model": stack.config.model_name, "messages": [{"role": "user", "content": "make a user"}], **body}


def streamed_calls(stack: Stack, body: dict) -> tuple[list[tuple[str, str]], str | None, str]:
    """(name, arguments) of each streamed call, the finish reason, and the streamed content."""
    calls: dict[int, list[str]] = {}
    finish, content = None, ""
    for chunk in client_for(stack).chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for entry in choice.delta.tool_calls or []:
                call = calls.setdefault(entry.index, ["", ""])
                call[0] += (entry.function.name or "") if entry.function else ""
                call[1] += (entry.function.arguments or "") if entry.function else ""
    return [(name, arguments) for name, arguments in calls.values()], finish, content


def test_an_argument_may_hold_the_end_marker(stack: Stack) -> None:
    body = ask(stack, tools=[tool("User", USER)], tool_choice="required", max_tokens=60, temperature=0)
    choice = client_for(stack).chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls
    assert json.loads(call.function.arguments)["name"] == MARKED
    jsonschema.validate(json.loads(call.function.arguments), USER)
    assert streamed_calls(stack, body) == ([(call.function.name, call.function.arguments)], "tool_calls", "")


def test_a_call_cut_by_max_tokens_is_a_partial_call(stack: Stack) -> None:
    body = ask(stack, tools=[tool("User", LONG_USER)], tool_choice="required", max_tokens=24, temperature=0)
    choice = client_for(stack).chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "length" and not choice.message.content
    [call] = choice.message.tool_calls
    full_arguments = json.dumps({"name": LONG_NAME})
    assert "User".startswith(call.function.name) and full_arguments.startswith(call.function.arguments)
    assert streamed_calls(stack, body) == ([(call.function.name, call.function.arguments)], "length", "")


def test_a_started_call_in_auto_mode_is_always_a_valid_call(stack: Stack) -> None:
    """The tokens of `<tool_call>` are made likely, so calls start; whatever follows is the grammar's to hold."""
    tools = [tool("get_weather", CITY), tool("User", USER)]
    bias = {"537": 6, "402": 6, "35": 6}  # models/tiny: "<tool", "_call", ">"
    body = ask(stack, tools=tools, max_tokens=120, temperature=1.0, seed=7, n=8, logit_bias=bias)
    reply = client_for(stack).chat.completions.create(**body)
    schemas = {"get_weather": CITY, "User": USER}
    for choice in reply.choices:
        assert "<tool_call>" not in (choice.message.content or ""), choice.message.content
        calls = choice.message.tool_calls or []
        complete = calls[:-1] if choice.finish_reason == "length" else calls
        for call in complete:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        assert choice.finish_reason == ("tool_calls" if calls else "stop") or choice.finish_reason == "length"
