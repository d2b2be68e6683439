"""Structured outputs and tools that cannot run get a 400 naming the field, before anything is recorded or
queued; ones that can are accepted (answered 503 here, with Redis down, after validation)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from api.app import create_app
from api.models.model_info import load_model_info
from tasks.config import Config
from tasks.store.db import upgrade_to_head
from tests.api.chat.test_validation import CHAT, COMPLETIONS, GOOD_MESSAGES, assert_nothing_recorded_or_queued
from tests.conftest import free_port, make_test_config

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
# Grammars that compile but match no text: the engine would mask every token of the row.
SELF_REF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
MUTUAL_REF = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
LOOPING_TOOL = {"type": "function", "function": {"name": "loop", "parameters": SELF_REF}}


@pytest.fixture(scope="module")
def config(tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Config:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('structured') / 'db.sqlite'}"
    upgrade_to_head(database_url)
    return make_test_config(tiny_model_dir, redis_url, database_url)


@pytest.fixture(scope="module")
def client(config: Config) -> Iterator[FlaskClient]:
    yield create_app(config).test_client()


def chat(model: str, **fields: object) -> dict:
    return {"model": model, "messages": GOOD_MESSAGES, **fields}


def json_schema(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


CASES = [
    (CHAT, lambda m: chat(m, response_format=json_schema({"type": "objectx"})), "response_format.json_schema.schema"),
    (CHAT, lambda m: chat(m, response_format=json_schema({"properties": [1]})), "response_format.json_schema.schema"),
    (CHAT, lambda m: chat(m, response_format={"type": "json_schema"}), "response_format.json_schema.json_schema"),
    (CHAT, lambda m: chat(m, response_format={"type": "xml"}), "response_format"),
    (CHAT, lambda m: chat(m, guided_regex="[a-"), "guided_regex"),
    (CHAT, lambda m: chat(m, structured_outputs={"regex": "(unclosed"}), "structured_outputs.regex"),
    (CHAT, lambda m: chat(m, structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs"),
    (CHAT, lambda m: chat(m, guided_json='{"type": '), "guided_json"),
    (CHAT, lambda m: chat(m, guided_grammar="root ::= missing_rule"), "guided_grammar"),
    (CHAT, lambda m: chat(m, guided_choice=[]), "guided_choice"),
    (CHAT, lambda m: chat(m, guided_regex="a+", guided_choice=["b"]), "guided_choice"),
    (CHAT, lambda m: chat(m, response_format={"type": "json_object"}, guided_regex="a"), "guided_regex"),
    (CHAT, lambda m: chat(m, guided_regex="a+", min_tokens=2), "min_tokens"),
    (CHAT, lambda m: chat(m, guided_regex="a+", ignore_eos=True), "ignore_eos"),
    (CHAT, lambda m: chat(m, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice"),
    (CHAT, lambda m: chat(m, tool_choice="required"), "tool_choice"),
    (CHAT, lambda m: chat(m, tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
    (CHAT, lambda m: chat(m, tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
     "tool_choice"),
    (CHAT, lambda m: chat(m, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]),
     "tools.0.function.parameters"),
    (CHAT, lambda m: chat(m, tools=[{"type": "function", "function": {"name": "bad name!"}}]),
     "tools.0.function.name"),
    (CHAT, lambda m: chat(m, functions=[WEATHER["function"]], function_call={"name": "nope"}), "function_call"),
    (CHAT, lambda m: chat(m, functions=[WEATHER["function"]], tools=[WEATHER]), "functions"),
    (CHAT, lambda m: chat(m, messages=[{"role": "tool", "content": "sunny"}]), "messages.0"),
    (CHAT, lambda m: chat(m, response_format=json_schema(SELF_REF)), "response_format.json_schema.schema"),
    (CHAT, lambda m: chat(m, guided_json=MUTUAL_REF), "guided_json"),
    (CHAT, lambda m: chat(m, guided_regex="[^\\s\\S]"), "guided_regex"),
    (CHAT, lambda m: chat(m, guided_grammar='root ::= a\na ::= a "x"'), "guided_grammar"),
    (CHAT, lambda m: chat(m, tools=[LOOPING_TOOL], tool_choice="required"), "tools.0.function.parameters"),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "guided_regex": "[a-"}, "guided_regex"),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "guided_json": SELF_REF}, "guided_json"),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "response_format": {"type": "json_object"}},
     "response_format"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "make_body", "param"), CASES)
def test_bad_constraints_are_refused_with_their_param(
    client: FlaskClient, config: Config, path: str, make_body, param: str
) -> None:
    response = client.post(path, json=make_body(config.model_name))
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert_nothing_recorded_or_queued(config)


LANGCHAIN_STRUCTURED = {  # ChatOpenAI(...).with_structured_output(Person, method="json_schema")
    "messages": [{"role": "user", "content": "describe Anna as JSON"}],
    "stream": False,
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "Person",
            "description": "A person.",
            "strict": False,
            "schema": {
                "properties": {"name": {"title": "Name", "type": "string"}, "age": {"title": "Age", "type": "integer"}},
                "required": ["name", "age"],
                "title": "Person",
                "type": "object",
            },
        },
    },
}
LANGCHAIN_TOOLS = {  # ChatOpenAI(...).bind_tools([get_weather], tool_choice="get_weather")
    "messages": [{"role": "user", "content": "what is the weather in Paris?"}],
    "stream": False,
    "tools": [{**WEATHER, "function": {**WEATHER["function"], "description": "Get the weather."}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": False,
}
HISTORY = [
    {"role": "user", "content": "what is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"weather": "sunny"}'},
]


@pytest.mark.parametrize(
    "body",
    [
        LANGCHAIN_STRUCTURED,
        LANGCHAIN_TOOLS,
        {"messages": HISTORY, "tools": [WEATHER]},
        {"messages": GOOD_MESSAGES, "response_format": {"type": "text"}},
        {"messages": GOOD_MESSAGES, "functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}},
        {"messages": GOOD_MESSAGES, "structured_outputs": {"grammar": 'root ::= "yes" | "no"'}},
        {"messages": GOOD_MESSAGES, "guided_json": {"type": "string", "format": "email"}},
        {"messages": GOOD_MESSAGES, "guided_json": {"type": "object", "properties": {"child": {"$ref": "#"}}}},
        {"messages": GOOD_MESSAGES, "guided_regex": ""},
    ],
)
def test_good_constraints_pass_validation(tiny_model_dir: Path, body: dict) -> None:
    closed_redis = Config(
        model=str(tiny_model_dir), database_url="sqlite://", redis_url=f"redis://127.0.0.1:{free_port()}/0"
    )
    response = create_app(closed_redis).test_client().post(CHAT, json={"model": "tiny", **body})
    assert response.status_code == 503, response.get_data(as_text=True)


def test_an_unknown_tool_call_parser_stops_the_api_at_start(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="TOOL_CALL_PARSER='mistral'"):
        load_model_info(Config(model=str(tiny_model_dir), tool_call_parser="mistral"))
