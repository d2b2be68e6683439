"""Refusing a prompt before tokenizing it, when its length in characters already proves it overflows the context.

Tokenizing costs time and memory in proportion to the text (a 10 MB message took 10 s and 1 GB), so a prompt that
cannot fit is refused by its length alone. The bound must be sound: never refuse a prompt that would fit.

For a BPE model, every token is a vocabulary entry (or an added token) and the tokens of a text cover it without
overlap. Byte-level BPE writes each byte as one character of its vocabulary, and every character is at least one
byte; SentencePiece-style BPE writes one character per character (a space as "▁"), and byte fallback spends at least
one token per character. So one token covers at most C characters of the text the model sees, where C is the
longest vocabulary entry or added token, and a text of L characters needs at least L / C tokens.

The model sees the text after the normalizer and pre-tokenizer. Those that only keep, split or expand characters
leave the argument as it is. Unicode composition (NFC, NFKC) turns at most MAX_COMPOSED_CHARS characters into one,
and replacing a literal of m characters by n turns at most ceil(m / n) into one: each divides by that (K). Anything
that can drop characters without limit (stripping, regex replacing, BERT's cleaning, a precompiled SentencePiece
map, a pre-tokenizer that removes whitespace, an added token that swallows the whitespace next to it, a fused
unknown token, a non-BPE model) gets no bound: its prompts are always tokenized.

So a text of more than max_model_len x C x K characters needs more than max_model_len tokens, and is refused."""

from __future__ import annotations

import json
import weakref
from typing import Any

from transformers import PreTrainedTokenizerFast

from api.errors import APIError

# The longest canonical decomposition is 4 code points (e.g. U+1F82), so composition joins at most 4 into 1.
MAX_COMPOSED_CHARS = 4
KEEPING_NORMALIZERS = frozenset(
    {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}
)  # each character becomes one or more
COMPOSING_NORMALIZERS = frozenset({"NFC", "NFKC"})
KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"})
SPLITTING_PRE_TOKENIZERS = frozenset({"Split", "Punctuation"})  # keep every character unless told to remove them
_CHARS_PER_TOKEN: weakref.WeakKeyDictionary[PreTrainedTokenizerFast, int | None] = weakref.WeakKeyDictionary()


def max_chars_per_token(tokenizer_json: dict[str, Any]) -> int | None:
    """C x K for a tokenizer (its tokenizer.json as a dict): at most this many characters of input per token; None
    when no such bound holds."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "BPE" or (
        model.get("unk_token") and model.get("fuse_unk") and not model.get("byte_fallback")
    ):
        return None
    added = tokenizer_json.get("added_tokens") or []
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None
    contraction = _normalizer_contraction(tokenizer_json.get("normalizer"))
    if contraction is None or not _pre_tokenizer_keeps_text(tokenizer_json.get("pre_tokenizer")):
        return None
    entries = [*model.get("vocab", {}), *(token["content"] for token in added)]
    return max(map(len, entries), default=1) * contraction


def _normalizer_contraction(normalizer: dict[str, Any] | None) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        contraction = 1
        for part in normalizer.get("normalizers", []):
            factor = _normalizer_contraction(part)
            if factor is None:
                return None
            contraction *= factor
        return contraction
    if kind in COMPOSING_NORMALIZERS:
        return MAX_COMPOSED_CHARS
    if kind == "Replace":
        return _replace_contraction(normalizer)
    return 1 if kind in KEEPING_NORMALIZERS else None


def _replace_contraction(replace: dict[str, Any]) -> int | None:
    """A literal m characters replaced by n (SentencePiece's " " -> "▁"): at most ceil(m / n) into one."""
    pattern, content = replace.get("pattern") or {}, replace.get("content", "")
    literal = pattern.get("String")
    if literal is None or not content:
        return None
    return max(1, -(-len(literal) // len(content)))


def _pre_tokenizer_keeps_text(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps_text(part) for part in pre_tokenizer.get("pretokenizers", []))
    if kind in SPLITTING_PRE_TOKENIZERS:
        return str(pre_tokenizer.get("behavior", "Isolated")).lower() != "removed"
    return kind in KEEPING_PRE_TOKENIZERS


def prompt_char_limit(tokenizer: PreTrainedTokenizerFast) -> int | None:
    """The most characters a prompt may have before it is sure to overflow tokenizer.model_max_length (which
    load_model_info sets to the served context); computed once per tokenizer."""
    if tokenizer not in _CHARS_PER_TOKEN:
        _CHARS_PER_TOKEN[tokenizer] = max_chars_per_token(json.loads(tokenizer.backend_tokenizer.to_str()))
    chars_per_token = _CHARS_PER_TOKEN[tokenizer]
    return None if chars_per_token is None else tokenizer.model_max_length * chars_per_token


def check_prompt_chars(tokenizer: PreTrainedTokenizerFast, text: str, param: str) -> None:
    limit = prompt_char_limit(tokenizer)
    if limit is not None and len(text) > limit:
        message = (
            f"This model's maximum context length is {tokenizer.model_max_length} tokens. However, your prompt's "
            f"{len(text)} characters make more tokens than that."
        )
        raise APIError(400, message, param=param, code="context_length_exceeded")
