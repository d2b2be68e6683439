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
# A byte-level model can write byte 0, but PostgreSQL's text and JSON cannot hold U+0000 (recording such a result
# failed and left its request unfinished) and many clients read it as the end of a string. Text shows it as U+FFFD,
# as it shows a byte that is not UTF-8; logprobs' `bytes` still carry the 0.
NUL = "\x00"
REPLACEMENT_CHARACTER = "\ufffd"


def visible_text(text: str) -> str:
    """`text` as every output carries it: U+0000 replaced by U+FFFD."""
    return text.replace(NUL, REPLACEMENT_CHARACTER)


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
        return visible_text("".join(chunk for chunk in chunks if chunk is not None))
