"""What real applications send on their second turn: the first reply replayed as openai's `model_dump()` or litellm's
message (unknown, mostly null fields inside messages), and an explicit null wherever the caller passed None. Both are
taken as OpenAI takes them; an unknown top-level field stays a 400 naming it."""

from __future__ import annotations

import openai
import pytest

from scripts.stack import Stack
from tests.service.batch_helpers import client_for

FIRST_TURN = [{"role": "user", "content": "name a color"}]
NULLS = ("temperature", "top_p", "n", "stream", "logprobs", "presence_penalty", "frequency_penalty")


def test_a_replayed_openai_message_dump_is_a_valid_history(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    reply = client.chat.completions.create(model=model, messages=FIRST_TURN, max_tokens=4, temperature=0)
    replayed = reply.choices[0].message.model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= replayed.keys()
    history = [*FIRST_TURN, replayed, {"role": "user", "content": "another"}]
    second = client.chat.completions.create(model=model, messages=history, max_tokens=4, temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length")


def test_a_stored_reasoning_history_is_a_valid_history(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    assistant = {"role": "assistant", "content": "blue", "reasoning_content": "thought", "refusal": None}
    history = [*FIRST_TURN, assistant, {"role": "user", "content": "another", "name": None}]
    reply = client.chat.completions.create(model=model, messages=history, max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_litellms_second_turn(stack: Stack) -> None:
    """The body litellm 1.106 sends on a second turn: its Message as it dumps (litellm 1.110 strips the extra
    fields itself, and pins an openai older than ours, so the request is sent here as 1.106 sent it)."""
    client, model = client_for(stack), stack.config.model_name
    reply = client.chat.completions.create(model=model, messages=FIRST_TURN, max_tokens=4, temperature=0)
    content = reply.choices[0].message.content
    replayed = {"content": content, "role": "assistant", "tool_calls": None, "function_call": None}
    replayed["provider_specific_fields"] = None
    history = [*FIRST_TURN, replayed, {"role": "user", "content": "another"}]
    second = client.chat.completions.create(model=model, messages=history, max_tokens=4, temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length")


def test_explicit_nulls_take_the_defaults(stack: Stack) -> None:
    """openai-python sends null for every argument its caller passed as None."""
    client, model = client_for(stack), stack.config.model_name
    nulls = dict.fromkeys(NULLS)
    reply = client.chat.completions.create(model=model, messages=FIRST_TURN, max_tokens=3, seed=1, **nulls)
    assert len(reply.choices) == 1 and reply.choices[0].logprobs is None
    text = client.completions.create(model=model, prompt="the dog", max_tokens=3, echo=None, **nulls)
    assert len(text.choices) == 1 and text.choices[0].logprobs is None


def test_unknown_top_level_fields_stay_refused(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=FIRST_TURN, extra_body={"refusal": None})
    assert "refusal" in raised.value.message
