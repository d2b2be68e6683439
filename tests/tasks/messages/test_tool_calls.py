"""Tool-call parsing: the Hermes and Llama-3 JSON formats, content around calls, and a stream that assembles to
what the whole text parses to, however it is split."""

from __future__ import annotations

import json
import random

import pytest

from tasks.messages.tool_calls import HERMES, LLAMA3_JSON, ToolCallStream, call_id, parse_reply

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>'


def calls_of(text: str, parser: str = HERMES) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in parse_reply(parser, text, "r:0").tool_calls]


def test_hermes_calls_are_parsed_and_content_is_none() -> None:
    reply = parse_reply(HERMES, WEATHER + "\n" + TIME, "chatcmpl-1:0")
    assert reply.content is None
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", '{"city": "Rome"}'),
    ]
    assert [c.id for c in reply.tool_calls] == [call_id("chatcmpl-1:0", 0), call_id("chatcmpl-1:0", 1)]
    assert reply.tool_calls[0].to_dict() == {
        "id": reply.tool_calls[0].id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }


def test_text_before_a_call_is_content() -> None:
    reply = parse_reply(HERMES, "Let me look.\n" + WEATHER, "r:0")
    assert reply.content == "Let me look."
    assert calls_of("Let me look.\n" + WEATHER) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris.",
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',  # cut off by max_tokens
        "a < b <tool_c",
    ],
)
def test_text_that_is_not_a_call_stays_content(text: str) -> None:
    reply = parse_reply(HERMES, text, "r:0")
    assert reply.tool_calls == [] and reply.content == text


def test_string_arguments_and_parameters_key_are_read() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
    assert calls_of(text) == [("f", {"x": 1})]
    assert calls_of('<tool_call>{"name": "f", "parameters": {"x": 2}}</tool_call>') == [("f", {"x": 2})]


def test_llama3_json_reply_is_calls_only_when_it_starts_as_one() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'
    assert calls_of(text, LLAMA3_JSON) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls_of('<|python_tag|>{"name": "f", "parameters": {"a": 1}}', LLAMA3_JSON) == [("f", {"a": 1})]
    plain = parse_reply(LLAMA3_JSON, 'The answer is {"a": 1}', "r:0")
    assert plain.tool_calls == [] and plain.content == 'The answer is {"a": 1}'
    broken = parse_reply(LLAMA3_JSON, '{"name": "f", "parameters": {', "r:0")
    assert broken.tool_calls == [] and broken.content == '{"name": "f", "parameters": {'


@pytest.mark.parametrize("parser", [HERMES, LLAMA3_JSON])
@pytest.mark.parametrize(
    "text",
    [
        "Sure.\n" + WEATHER + "\n" + TIME + "\nDone.  ",
        WEATHER + "\n<tool_call>\nbroken\n</tool_call> tail",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "  plain text with <tool trailing",
    ],
)
def test_any_split_of_a_stream_assembles_to_the_whole_parse(parser: str, text: str) -> None:
    whole = parse_reply(parser, text, "r:0")
    rng = random.Random(0)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream, content, calls = ToolCallStream(parser, "r:0"), "", []
        for piece in pieces:
            shown, new_calls = stream.feed(piece)
            content, calls = content + shown, calls + new_calls
        shown, new_calls = stream.flush()
        content, calls = content + shown, calls + new_calls
        assert calls == whole.tool_calls
        assert (content or None if calls else content) == whole.content


def test_call_delta_entries_have_openai_stream_shape() -> None:
    call = parse_reply(HERMES, WEATHER, "r:0").tool_calls[0]
    header, arguments = call.delta_entries(3)
    assert header == {
        "index": 3,
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert arguments == {"index": 3, "function": {"arguments": '{"city": "Paris"}'}}


def test_an_argument_string_may_hold_the_end_marker() -> None:
    call = '<tool_call>\n{"name": "User", "arguments": {"name": "a</tool_call>b"}}\n</tool_call>'
    for text in (call, "Sure. " + call + "\n" + call):
        reply = parse_reply(HERMES, text, "r:0")
        assert [json.loads(c.arguments) for c in reply.tool_calls] == [{"name": "a</tool_call>b"}] * text.count(call)
        assert reply.content == ("Sure." if text.startswith("Sure.") else None)


@pytest.mark.parametrize(
    ("parser", "text", "expected"),
    [
        (HERMES, 'Hi <tool_call>\n{"name": "User", "arguments": {"name": "An', ("User", '{"name": "An')),
        (HERMES, '<tool_call>\n{"name": "Us', ("Us", "")),
        (HERMES, "<tool_call>\n", ("", "")),
        (LLAMA3_JSON, '{"name": "get_time", "parameters": {}}; {"name": "User", "parameters": {"a', ("User", '{"a')),
    ],
)
def test_a_call_cut_by_max_tokens_is_a_partial_call(parser: str, text: str, expected: tuple[str, str]) -> None:
    reply = parse_reply(parser, text, "r:0", is_cut=True)
    assert (reply.tool_calls[-1].name, reply.tool_calls[-1].arguments) == expected
    assert "<tool_call>" not in (reply.content or "")
    assert len(parse_reply(parser, text, "r:0").tool_calls) < len(
        reply.tool_calls
    )  # not cut: the unclosed call is text
