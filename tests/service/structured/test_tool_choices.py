"""tool_choice as OpenAI takes it: `allowed_tools` (every tool shown, a subset callable, freely or at least once) on
chat and Responses, and a named function answered with finish_reason "stop"."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from scripts.stack import Stack
from tests.service.batch_helpers import client_for
from tests.service.structured.test_structured_outputs import SCHEMA_OF, TOOLS, ask


def allowed(mode: str, *names: str) -> dict:
    tools = [{"type": "function", "function": {"name": name}} for name in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def test_allowed_tools_required_calls_only_the_allowed(stack: Stack) -> None:
    reply = client_for(stack).chat.completions.create(
        model=stack.config.model_name, messages=ask("what is the weather in Rome?"), tools=TOOLS,  # type: ignore[arg-type]
        tool_choice=allowed("required", "add_numbers"), max_tokens=80, temperature=0.7, seed=3,  # type: ignore[arg-type]
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "add_numbers"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA_OF["add_numbers"])


def test_allowed_tools_in_responses(stack: Stack) -> None:
    tools = [{"type": "function", "name": tool["function"]["name"], "parameters": tool["function"]["parameters"]}
             for tool in TOOLS]  # fmt: skip
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}
    response = client_for(stack).responses.create(
        model=stack.config.model_name, input="what is 3 plus 4?", tools=tools, tool_choice=choice,  # type: ignore[arg-type]
        max_output_tokens=80, temperature=0,
    )  # fmt: skip
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and {call.name for call in calls} == {"get_weather"}
    assert response.tool_choice.model_dump(exclude_none=True) == choice  # type: ignore[union-attr]


def test_an_allowed_tool_must_be_offered(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client_for(stack).chat.completions.create(
            model=stack.config.model_name, messages=ask("hi"), tools=TOOLS,  # type: ignore[arg-type]
            tool_choice=allowed("auto", "get_time"),  # type: ignore[arg-type]
        )  # fmt: skip
    assert raised.value.body["param"] == "tool_choice.allowed_tools.tools"  # type: ignore[index]


def test_a_named_function_finishes_with_stop(stack: Stack) -> None:
    body = {"model": stack.config.model_name, "messages": ask("add 3 and 4"), "tools": TOOLS, "max_tokens": 80,
            "tool_choice": {"type": "function", "function": {"name": "add_numbers"}}, "temperature": 0}  # fmt: skip
    choice = client_for(stack).chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "stop" and [call.function.name for call in choice.message.tool_calls] == [
        "add_numbers"
    ]
    chunks = list(client_for(stack).chat.completions.create(**body, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


@pytest.mark.parametrize("function_call", [None, {"name": "add_numbers"}])
def test_legacy_functions_are_answered_with_function_call(stack: Stack, function_call: dict | None) -> None:
    """A named function_call forces the call; without one the call is the model's choice, made likely here by
    biasing the tokens of `<tool_call>` (models/tiny: "<tool", "_call", ">")."""
    functions = [tool["function"] for tool in TOOLS]
    body = {"model": stack.config.model_name, "messages": ask("add 3 and 4"), "functions": functions,
            "max_tokens": 80, "temperature": 0, "logit_bias": {"537": 30, "402": 30, "35": 30}}  # fmt: skip
    if function_call is not None:
        body["function_call"] = function_call
    choice = client_for(stack).chat.completions.create(**body).choices[0]
    assert choice.message.tool_calls is None and choice.message.function_call is not None
    call = choice.message.function_call
    jsonschema.validate(json.loads(call.arguments), SCHEMA_OF[call.name])
    assert choice.finish_reason == ("stop" if function_call else "function_call")
    name, arguments, finish = "", "", None
    for chunk in client_for(stack).chat.completions.create(**body, stream=True):
        delta = chunk.choices[0].delta
        assert delta.tool_calls is None
        name += (delta.function_call.name or "") if delta.function_call else ""
        arguments += (delta.function_call.arguments or "") if delta.function_call else ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == (call.name, call.arguments, choice.finish_reason)
