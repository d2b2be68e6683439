"""OpenAI's usage details through the service: prompt tokens the prefix cache served, and the proposed tokens
speculative decoding accepted or rejected."""

from __future__ import annotations

from openai.types import CompletionUsage

from scripts.stack import Stack
from tests.service.chat.test_openai_client import client_for

SYSTEM = "You are a careful assistant. " * 12  # several KV blocks of shared prefix


def test_a_repeated_prefix_is_reported_as_cached(stack: Stack) -> None:
    client = client_for(stack)

    def ask(question: str) -> CompletionUsage:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        reply = client.chat.completions.create(model=stack.config.model_name, messages=messages, max_tokens=4)
        return reply.usage

    first = ask("what is 2 plus 2?")
    second = ask("name a color")
    assert first.prompt_tokens_details.cached_tokens < 64  # only what earlier tests' chat template prefix left
    assert second.prompt_tokens_details.cached_tokens >= 64
    assert second.prompt_tokens_details.cached_tokens < second.prompt_tokens


def test_speculation_counts_are_reported(stack: Stack) -> None:
    client = client_for(stack)
    prompt = "one two three four one two three four one two three four one two"
    reply = client.completions.create(
        model=stack.config.model_name, prompt=prompt, max_tokens=32, temperature=0, extra_body={"ignore_eos": True}
    )
    details = reply.usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
    assert details.accepted_prediction_tokens <= reply.usage.completion_tokens


def test_a_request_can_turn_speculation_off(stack: Stack) -> None:
    client = client_for(stack)
    base = {"model": stack.config.model_name, "prompt": "one two three four one two three four one two",
            "max_tokens": 24, "temperature": 0}  # fmt: skip
    default = client.completions.create(**base, extra_body={"ignore_eos": True})
    off = client.completions.create(**base, extra_body={"ignore_eos": True, "speculative": {"method": "none"}})
    assert off.choices[0].text == default.choices[0].text
    off_details = off.usage.completion_tokens_details
    assert off_details.accepted_prediction_tokens == off_details.rejected_prediction_tokens == 0


def test_a_request_can_pick_the_self_draft_proposer(stack: Stack) -> None:
    client = client_for(stack)
    base = {"model": stack.config.model_name, "prompt": "once upon a time", "max_tokens": 24, "temperature": 0}
    plain = client.completions.create(**base, extra_body={"ignore_eos": True, "speculative": {"method": "none"}})
    drafted = client.completions.create(
        **base, extra_body={"ignore_eos": True, "speculative": {"method": "self", "num_tokens": 3}}
    )
    assert drafted.choices[0].text == plain.choices[0].text
    details = drafted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
