"""Several prompts in one completion request (strings or token ids, n choices each), streamed or not, and streamed
logprobs' text offsets, through the `openai` client against a running stack; and the same in a batch line."""

from __future__ import annotations

from collections import defaultdict

import pytest
from openai.types import Completion

from scripts.stack import Stack
from tests.service.batch_helpers import read_jsonl, submit, wait_for_end
from tests.service.chat.test_openai_client import client_for

TEXT_PROMPTS = ["the dog", "a cat sat on the", "once upon a time"]
TOKEN_PROMPTS = [[1144, 875, 300, 674], [226, 454, 471, 88, 300]]


def alone(stack: Stack, prompt: str | list[str] | list[int] | list[list[int]], **fields: object) -> Completion:
    return client_for(stack).completions.create(
        **{"model": stack.config.model_name, "prompt": prompt, "max_tokens": 6, "temperature": 0, **fields}
    )


@pytest.mark.parametrize("prompts", [TEXT_PROMPTS, TOKEN_PROMPTS], ids=["strings", "token-ids"])
def test_each_prompt_gets_n_choices_equal_to_running_it_alone(stack: Stack, prompts: list) -> None:
    reply = alone(stack, prompts, n=2)
    singles = [alone(stack, prompt) for prompt in prompts]
    assert [choice.index for choice in reply.choices] == list(range(2 * len(prompts)))
    for choice in reply.choices:
        assert choice.text == singles[choice.index // 2].choices[0].text
    assert reply.usage.prompt_tokens == sum(single.usage.prompt_tokens for single in singles)
    assert reply.usage.completion_tokens == 2 * sum(single.usage.completion_tokens for single in singles)


def test_streamed_prompts_carry_their_choice_index(stack: Stack) -> None:
    whole = alone(stack, TEXT_PROMPTS, n=2)
    stream = client_for(stack).completions.create(
        model=stack.config.model_name, prompt=TEXT_PROMPTS, max_tokens=6, temperature=0, n=2, stream=True
    )
    texts: dict[int, str] = defaultdict(str)
    finished = set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == set(range(2 * len(TEXT_PROMPTS)))
    assert dict(texts) == {choice.index: choice.text for choice in whole.choices}


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_text_offsets_count_on_across_chunks(stack: Stack, echo: bool) -> None:
    fields = {"max_tokens": 12, "logprobs": 1, "echo": echo}
    whole = alone(stack, TOKEN_PROMPTS[0], **fields)
    stream = client_for(stack).completions.create(
        model=stack.config.model_name, prompt=TOKEN_PROMPTS[0], temperature=0, stream=True, **fields
    )
    text, tokens, offsets = "", [], []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
    assert len(tokens) == whole.usage.completion_tokens + (len(TOKEN_PROMPTS[0]) if echo else 0) > 1
    assert offsets == [sum(len(token) for token in tokens[:i]) for i in range(len(tokens))]
    assert (text, tokens, offsets) == (
        whole.choices[0].text,
        whole.choices[0].logprobs.tokens,
        whole.choices[0].logprobs.text_offset,
    )


def test_a_batch_line_scores_and_runs_several_prompts(stack: Stack) -> None:
    body = {
        "model": stack.config.model_name,
        "prompt": TOKEN_PROMPTS,
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": 1,
        "echo": True,
        "prompt_logprobs": 1,
    }
    line = {"custom_id": "scored", "method": "POST", "url": "/v1/completions", "body": body}
    batch = wait_for_end(stack, submit(stack, [line], endpoint="/v1/completions"))
    [output] = read_jsonl(stack, batch.output_file_id)
    lines_body = output["response"]["body"]
    fields = {key: value for key, value in body.items() if key != "prompt_logprobs"}
    direct = client_for(stack).completions.create(**fields, extra_body={"prompt_logprobs": 1}).model_dump()
    assert [choice["index"] for choice in lines_body["choices"]] == [0, 1]
    for mine, theirs in zip(lines_body["choices"], direct["choices"], strict=True):
        assert mine["text"] == theirs["text"]
        assert mine["logprobs"]["tokens"] == theirs["logprobs"]["tokens"]
        assert mine["logprobs"]["token_logprobs"] == pytest.approx(theirs["logprobs"]["token_logprobs"], abs=1e-5)
        assert len(mine["prompt_logprobs"]) == len(TOKEN_PROMPTS[mine["index"]])
    assert lines_body["usage"]["prompt_tokens"] == sum(len(prompt) for prompt in TOKEN_PROMPTS)
