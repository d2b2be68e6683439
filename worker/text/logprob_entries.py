"""Token logprobs as OpenAI's chat `logprobs.content` entries: each token's text, its UTF-8 bytes and logprob."""

from __future__ import annotations

import functools
from typing import Any

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tasks.messages import TokenLogprob


def logprob_entries(tokenizer: PreTrainedTokenizerFast, logprobs: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    return [
        {
            **_token(tokenizer, entry.token_id, entry.logprob),
            "top_logprobs": [_token(tokenizer, *pair) for pair in entry.top],
        }
        for entry in logprobs
    ]


def _token(tokenizer: PreTrainedTokenizerFast, token_id: int, logprob: float) -> dict[str, Any]:
    # A byte-level token may hold part of a UTF-8 character: its text then shows U+FFFD, and `bytes` tells the truth.
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(_token_bytes(tokenizer, token_id, text))}


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
