"""Turns one request's generated token ids into text incrementally, never emitting half a character."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase


def backend_of(tokenizer: PreTrainedTokenizerBase | Tokenizer) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TypeError(f"{type(tokenizer).__name__} has no fast (tokenizers) backend to stream-decode with")
    return backend


PROMPT_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """One per request; special tokens (EOS included) produce no text unless `skip_special_tokens` is false."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | Tokenizer,
        prompt_ids: list[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._backend = backend_of(tokenizer)
        # The prompt's tail as context: SentencePiece-style decoders drop the leading space of a first token.
        context = list(prompt_ids or [])[-PROMPT_CONTEXT_TOKENS:]
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)

    def push(self, token_ids: list[int]) -> str:
        """Returns the text completed by these tokens; bytes of an unfinished character wait for the next push."""
        chunks = (self._stream.step(self._backend, token_id) for token_id in token_ids)
        return "".join(chunk for chunk in chunks if chunk is not None)
