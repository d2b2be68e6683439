"""Greedy cases that no rounding can flip: a chat prompt extended by its float32 greedy tokens up to the longest run
of steps whose top logit leads the runner-up by at least MARGIN, and that run's length. Checked tolerance-free in
float32 once, a case's tokens are the same in bfloat16, in graphs or eager, whatever the kernels' summation order."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

QUESTIONS = [
    "tell me about dogs",
    "what is 3 plus 4?",
    "tell me a story",
    "what is the capital of Peru?",
    "tell me about cats",
    "Tell me about horses.",
]
MARGIN = 1.0  # logits; bfloat16 moves the tiny model's logits by a few hundredths
SEARCH_TOKENS = 24  # the float32 continuation searched for a clear run
MIN_RUN = 4  # shorter runs make no case


def chat_prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    chats = [[{"role": "user", "content": question}] for question in QUESTIONS]
    return [list(tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]) for chat in chats]


def greedy_margins(model: PreTrainedModel, prompt: list[int]) -> tuple[list[int], list[float]]:
    """The greedy continuation (EOS not stopping it) and, per step, the top logit's lead over the runner-up."""
    input_ids = torch.tensor([prompt], device=model.device)
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=SEARCH_TOKENS,
        eos_token_id=[],
        output_scores=True,
        return_dict_in_generate=True,
    )
    top_two = torch.stack([scores[0].float().topk(2).values for scores in output.scores])  # [steps, 2]
    return output.sequences[0, len(prompt) :].tolist(), (top_two[:, 0] - top_two[:, 1]).tolist()


def clear_case(model: PreTrainedModel, prompt: list[int]) -> tuple[list[int], int]:
    """The prompt extended to the start of its continuation's longest run of clear steps, and that run's length."""
    tokens, margins = greedy_margins(model, prompt)
    best_start, best_length, start = 0, 0, 0
    for step, margin in enumerate([*margins, 0.0]):
        if margin < MARGIN:
            if step - start > best_length:
                best_start, best_length = start, step - start
            start = step + 1
    return prompt + tokens[:best_start], best_length


def clear_cases(float32_model: PreTrainedModel, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """Every prompt's clear case with a run of at least MIN_RUN tokens."""
    return [case for case in (clear_case(float32_model, prompt) for prompt in prompts) if case[1] >= MIN_RUN]
