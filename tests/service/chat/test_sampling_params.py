"""OpenAI's and vLLM's sampling parameters through HTTP with the `openai` client: logprobs, seeds, penalties,
min_tokens and stop_token_ids reach the engine and come back in OpenAI's shapes."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from scripts.stack import Stack
from tests.service.chat.test_openai_client import client_for

MESSAGES = [{"role": "user", "content": "tell me a story about a cat"}]


def test_chat_logprobs_have_openais_shape(stack: Stack) -> None:
    reply = client_for(stack).chat.completions.create(
        model=stack.config.model_name, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the most likely
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token
    assert content[0].top_logprobs[0].logprob == pytest.approx(content[0].logprob)


def test_completion_logprobs_are_the_legacy_lists(stack: Stack) -> None:
    reply = client_for(stack).completions.create(
        model=stack.config.model_name, prompt="the dog", max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == reply.usage.completion_tokens
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


def test_streamed_chat_carries_logprobs(stack: Stack) -> None:
    stream = client_for(stack).chat.completions.create(
        model=stack.config.model_name, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, stream=True
    )
    entries = [
        e for chunk in stream if chunk.choices and chunk.choices[0].logprobs for e in chunk.choices[0].logprobs.content
    ]
    assert 1 <= len(entries) <= 6


def test_same_seed_same_text_and_other_seeds_differ(stack: Stack) -> None:
    client = client_for(stack)

    def sample(seed: int) -> str:
        reply = client.completions.create(
            model=stack.config.model_name, prompt="once upon a time", max_tokens=24, temperature=1.3, seed=seed,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return reply.choices[0].text

    first = sample(11)
    assert sample(11) == first
    assert len({first, sample(12), sample(13)}) > 1


def test_min_tokens_and_stop_token_ids_reach_the_engine(stack: Stack) -> None:
    client = client_for(stack)
    base = {"model": stack.config.model_name, "prompt": "the dog", "temperature": 0, "max_tokens": 40}
    natural = client.completions.create(**base)
    num_held = natural.usage.completion_tokens + 4  # past where the model stops (or was cut off) on its own
    held = client.completions.create(**{**base, "max_tokens": num_held + 4}, extra_body={"min_tokens": num_held})
    assert held.usage.completion_tokens >= num_held

    tokens = client.completions.create(**{**base, "max_tokens": 8}, logprobs=0, extra_body={"ignore_eos": True})
    third_token_text = tokens.choices[0].logprobs.tokens[2]
    stop_id = stack_tokenizer_id(stack, third_token_text)
    stopped = client.completions.create(
        **{**base, "max_tokens": 8}, extra_body={"ignore_eos": True, "stop_token_ids": [stop_id]}
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens <= 3


def stack_tokenizer_id(stack: Stack, token_text: str) -> int:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(stack.config.model)
    [token_id] = tokenizer.encode(token_text, add_special_tokens=False)
    return token_id


def test_penalties_change_the_greedy_text(stack: Stack) -> None:
    client = client_for(stack)
    base = {"model": stack.config.model_name, "prompt": "count: one, two, one, two,", "temperature": 0,
            "max_tokens": 32, "extra_body": {"ignore_eos": True}}  # fmt: skip
    plain = client.completions.create(**base).choices[0].text
    penalized = client.completions.create(**base, frequency_penalty=2.0, presence_penalty=2.0).choices[0].text
    assert penalized != plain


def test_n_choices_non_streamed_and_streamed_agree(stack: Stack) -> None:
    client = client_for(stack)
    params = {"model": stack.config.model_name, "messages": MESSAGES, "max_tokens": 10, "temperature": 1.2, "seed": 5}
    reply = client.chat.completions.create(**params, n=3, logprobs=True)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == sum(len(choice.logprobs.content) for choice in reply.choices)
    texts = [choice.message.content for choice in reply.choices]
    assert len(set(texts)) > 1, "seed + i gives each choice its own draws"

    streamed: dict[int, str] = {0: "", 1: "", 2: ""}
    finished: dict[int, str] = {}
    for chunk in client.chat.completions.create(**params, n=3, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert [streamed[i] for i in range(3)] == texts
    assert sorted(finished) == [0, 1, 2]
