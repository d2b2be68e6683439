"""Scoring prompts as lm-eval does it (echo with logprobs, max_tokens 0), vLLM's prompt_logprobs, and logit_bias,
through real HTTP and the `openai` client, checked against HF transformers' own forward pass of the tiny model."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from scripts.stack import Stack
from tests.service.chat.test_openai_client import client_for
from tests.service.http import auth

LM_EVAL_PROMPT = [1144, 875, 300, 674, 226, 454, 471, 88]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)


def hf_logprobs(model: PreTrainedModel, prompt: list[int]) -> torch.Tensor:
    """[L, V]: log_softmax at every prompt position; row p scores token p + 1 (the last, the first output)."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)


def lm_eval_body(stack: Stack, **changes: object) -> dict:
    body = {
        "model": stack.config.model_name,
        "prompt": [LM_EVAL_PROMPT],
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    return {**body, **changes}


def check_echoed_prompt(logprobs: dict, model: PreTrainedModel, prompt: list[int]) -> None:
    expected = hf_logprobs(model, prompt)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for position in range(1, len(prompt)):
        want = expected[position - 1, prompt[position]].item()
        assert logprobs["token_logprobs"][position] == pytest.approx(want, abs=TOLERANCE)
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    assert offsets == [sum(len(token) for token in tokens[:i]) for i in range(len(tokens))]


def check_lm_eval_reply(reply: dict, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    [choice] = reply["choices"]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(LM_EVAL_PROMPT) + 1
    check_echoed_prompt(logprobs, model, LM_EVAL_PROMPT)
    last = hf_logprobs(model, LM_EVAL_PROMPT)[-1]
    generated = int(last.argmax())  # greedy
    assert logprobs["tokens"][-1] == tokenizer.decode([generated])
    assert logprobs["token_logprobs"][-1] == pytest.approx(last[generated].item(), abs=TOLERANCE)
    # generated text skips special tokens, as ever; the echoed prompt is decoded as vLLM echoes token prompts
    assert choice["text"] == tokenizer.decode(LM_EVAL_PROMPT) + tokenizer.decode([generated], skip_special_tokens=True)
    assert reply["usage"]["prompt_tokens"] == len(LM_EVAL_PROMPT) and reply["usage"]["completion_tokens"] == 1


def test_lm_eval_loglikelihood_request_over_raw_http(
    stack: Stack, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    response = requests.post(
        f"{stack.base_url}/v1/completions", json=lm_eval_body(stack), headers=auth(stack), timeout=120
    )
    assert response.status_code == 200, response.text
    check_lm_eval_reply(response.json(), hf_model, tokenizer)


def test_lm_eval_loglikelihood_request_through_the_openai_client(
    stack: Stack, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    reply = client_for(stack).completions.create(**lm_eval_body(stack))
    check_lm_eval_reply(reply.model_dump(), hf_model, tokenizer)


def test_max_tokens_0_with_echo_scores_the_prompt_only(
    stack: Stack, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    reply = client_for(stack).completions.create(**lm_eval_body(stack, max_tokens=0)).model_dump()
    [choice] = reply["choices"]
    assert choice["text"] == tokenizer.decode(LM_EVAL_PROMPT) and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(LM_EVAL_PROMPT)
    check_echoed_prompt(choice["logprobs"], hf_model, LM_EVAL_PROMPT)
    assert reply["usage"]["completion_tokens"] == 0


def test_vllm_prompt_logprobs_on_completions_and_chat(
    stack: Stack, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    body = {"model": stack.config.model_name, "prompt": LM_EVAL_PROMPT, "max_tokens": 2, "prompt_logprobs": 2}
    reply = requests.post(f"{stack.base_url}/v1/completions", json=body, headers=auth(stack), timeout=120).json()
    scored = reply["choices"][0]["prompt_logprobs"]
    expected = hf_logprobs(hf_model, LM_EVAL_PROMPT)
    assert len(scored) == len(LM_EVAL_PROMPT) and scored[0] is None
    for position, entry in enumerate(scored[1:], start=1):
        token_id = LM_EVAL_PROMPT[position]
        row = expected[position - 1]
        mine = entry[str(token_id)]
        assert mine["logprob"] == pytest.approx(row[token_id].item(), abs=TOLERANCE)
        assert mine["rank"] == int((row > row[token_id]).sum()) + 1
        assert mine["decoded_token"] == tokenizer.decode([token_id])
        best = int(row.argmax())
        assert entry[str(best)]["rank"] == 1 and len(entry) <= 3
    chat = {
        "model": stack.config.model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "prompt_logprobs": 0,
    }
    chat_reply = requests.post(
        f"{stack.base_url}/v1/chat/completions", json=chat, headers=auth(stack), timeout=120
    ).json()
    prompt_logprobs = chat_reply["prompt_logprobs"]
    assert len(prompt_logprobs) == chat_reply["usage"]["prompt_tokens"] and prompt_logprobs[0] is None
    assert all(len(entry) == 1 for entry in prompt_logprobs[1:])  # 0 alternatives: the prompt's token alone


def test_logit_bias_forces_and_bans_greedy_picks(
    stack: Stack, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> None:
    client = client_for(stack)
    natural = int(hf_logprobs(hf_model, LM_EVAL_PROMPT)[-1].argmax())
    favoured = next(token for token in range(300, 400) if token != natural and tokenizer.decode([token]).strip())
    common = {"model": stack.config.model_name, "prompt": LM_EVAL_PROMPT, "max_tokens": 1, "temperature": 0}
    forced = client.completions.create(**common, logprobs=0, logit_bias={str(favoured): 100})
    assert forced.choices[0].logprobs.tokens == [tokenizer.decode([favoured])]
    banned = client.completions.create(**common, logprobs=0, logit_bias={str(natural): -100})
    assert banned.choices[0].logprobs.tokens != [tokenizer.decode([natural])]
    chat_forced = client.chat.completions.create(
        model=stack.config.model_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        temperature=0,
        logprobs=True,
        logit_bias={str(favoured): 100},
    )
    assert chat_forced.choices[0].logprobs.content[0].token == tokenizer.decode([favoured])
    for bad in ({str(favoured): 100.5}, {"not-a-token": 1}, {"99999999": 1}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(**common, logit_bias=bad)
        assert refused.value.body["param"] == "logit_bias"


@pytest.mark.parametrize("add_special_tokens", [None, False])  # None: left out, so true
def test_a_text_prompt_is_echoed_as_sent(
    stack: Stack, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, add_special_tokens: bool | None
) -> None:
    """The BOS the tokenizer adds to a text prompt (add_special_tokens, true by default) is the model's input, not
    the client's text: the echo leaves it out, and its first token is scored after the BOS."""
    prompt = "the dog ran home"
    body = lm_eval_body(stack, prompt=prompt, max_tokens=0)
    if add_special_tokens is not None:
        body["add_special_tokens"] = add_special_tokens
    reply = requests.post(f"{stack.base_url}/v1/completions", json=body, headers=auth(stack), timeout=120).json()
    [choice] = reply["choices"]
    sent = tokenizer.encode(prompt, add_special_tokens=add_special_tokens is not False)
    plain = tokenizer.encode(prompt, add_special_tokens=False)
    assert choice["text"] == prompt and reply["usage"]["prompt_tokens"] == len(sent)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [tokenizer.decode([token]) for token in plain]
    expected = hf_logprobs(hf_model, sent)
    skipped = len(sent) - len(plain)
    want = [expected[skipped + i - 1, token].item() if skipped + i else None for i, token in enumerate(plain)]
    assert logprobs["token_logprobs"] == [w if w is None else pytest.approx(w, abs=TOLERANCE) for w in want]
