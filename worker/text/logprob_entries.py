"""Token logprobs as OpenAI's chat `logprobs.content` entries (each token's text, its UTF-8 bytes and logprob), and a
prompt's as echoed entries and as vLLM's `prompt_logprobs`."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tasks.messages.generation import TokenLogprob
from worker.text.detokenizer import visible_text


def logprob_entries(tokenizer: PreTrainedTokenizerFast, logprobs: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    return [
        {
            **_token(tokenizer, entry.token_id, entry.logprob),
            "top_logprobs": [_token(tokenizer, *pair) for pair in entry.top],
        }
        for entry in logprobs
    ]


def echo_entries(
    tokenizer: PreTrainedTokenizerFast,
    prompt_ids: list[int],
    scored: tuple[TokenLogprob | None, ...],
    num_top: int,
) -> list[dict[str, Any]]:
    """The prompt's entries, as an echoing completion's logprobs start: the first token's logprob is None, as in
    OpenAI's legacy API and vLLM (nothing precedes it); `scored` holds the engine's entries, None first."""
    first = {**_token(tokenizer, prompt_ids[0], None), "top_logprobs": []}
    rest = tuple(dataclasses.replace(entry, top=entry.top[:num_top]) for entry in scored[1:] if entry is not None)
    return [first, *logprob_entries(tokenizer, rest)]


def vllm_prompt_logprobs(
    tokenizer: PreTrainedTokenizerFast, scored: tuple[TokenLogprob | None, ...], num_top: int
) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then per token, by token id, the prompt's token and the
    `num_top` most likely, each with its logprob, rank and decoded text."""
    return [None] + [_vllm_position(tokenizer, entry, num_top) for entry in scored[1:] if entry is not None]


def _vllm_position(tokenizer: PreTrainedTokenizerFast, entry: TokenLogprob, num_top: int) -> dict[str, Any]:
    ranked = [(entry.token_id, entry.logprob, entry.rank)]
    ranked += [(token_id, logprob, rank) for rank, (token_id, logprob) in enumerate(entry.top[:num_top], start=1)]
    return {
        str(token_id): {"logprob": logprob, "rank": rank, "decoded_token": visible_text(tokenizer.decode([token_id]))}
        for token_id, logprob, rank in ranked
    }


def _token(tokenizer: PreTrainedTokenizerFast, token_id: int, logprob: float | None) -> dict[str, Any]:
    # A byte-level token may hold part of a UTF-8 character: its text then shows U+FFFD, and `bytes` tells the truth.
    text = tokenizer.decode([token_id])
    return {"token": visible_text(text), "logprob": logprob, "bytes": list(_token_bytes(tokenizer, token_id, text))}


def _token_bytes(tokenizer: PreTrainedTokenizerFast, token_id: int, text: str) -> bytes:
    piece = tokenizer.convert_ids_to_tokens(token_id)
    byte_decoder = _byte_level_decoder()
    if piece and all(char in byte_decoder for char in piece):
        return bytes(byte_decoder[char] for char in piece)
    return text.encode("utf-8")


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """How ByteLevel BPE spells each raw byte, inverted."""
    return {char: byte for byte, char in bytes_to_unicode().items()}
