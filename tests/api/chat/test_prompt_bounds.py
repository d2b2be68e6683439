"""The prompt character bound: which tokenizers have one and how large, that it is sound (no text within it is
refused that would fit; every text beyond it has more tokens than the context), and that refusing is fast."""

from __future__ import annotations

import json
import random
import time
import unicodedata
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from api.chat.prompt_bounds import MAX_COMPOSED_CHARS, check_prompt_chars, max_chars_per_token, prompt_char_limit
from api.errors import APIError

BPE = {"type": "BPE", "vocab": {"a": 0, "abcd": 1, "▁the": 2}, "unk_token": None, "byte_fallback": False}
ADDED = [{"content": "<|special_token|>", "lstrip": False, "rstrip": False}]
SPLIT = {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated"}
REPLACE = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    loaded = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    loaded.model_max_length = 64
    return loaded


def tokenizer_json(**parts: object) -> dict:
    return {"model": BPE, "added_tokens": ADDED, "normalizer": None, "pre_tokenizer": None, **parts}


@pytest.mark.parametrize(
    ("parts", "chars_per_token"),
    [
        ({}, len("<|special_token|>")),
        ({"added_tokens": []}, 4),
        ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [SPLIT, {"type": "ByteLevel"}]}}, 17),
        ({"normalizer": {"type": "NFC"}}, 17 * MAX_COMPOSED_CHARS),
        ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, REPLACE]}}, 17),
        ({"normalizer": {**REPLACE, "pattern": {"String": "   "}, "content": "_"}}, 17 * 3),
        ({"normalizer": {**REPLACE, "pattern": {"Regex": "\\s+"}}}, None),
        ({"normalizer": {"type": "StripAccents"}}, None),
        ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Strip"}]}}, None),
        ({"normalizer": {"type": "BertNormalizer"}}, None),
        ({"normalizer": {"type": "Precompiled"}}, None),
        ({"pre_tokenizer": {"type": "Whitespace"}}, None),
        ({"pre_tokenizer": {"type": "BertPreTokenizer"}}, None),
        ({"pre_tokenizer": {**SPLIT, "behavior": "Removed"}}, None),
        ({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, None),
        ({"model": {**BPE, "unk_token": "<unk>", "fuse_unk": True}}, None),
        ({"model": {**BPE, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True}}, 17),
        ({"added_tokens": [{**ADDED[0], "lstrip": True}]}, None),
    ],
)
def test_which_tokenizers_have_a_bound(parts: dict, chars_per_token: int | None) -> None:
    assert max_chars_per_token(tokenizer_json(**parts)) == chars_per_token


def test_composition_joins_at_most_max_composed_chars_into_one() -> None:
    longest = max(len(unicodedata.normalize("NFD", chr(c))) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert longest == MAX_COMPOSED_CHARS


def test_the_tiny_tokenizer_bound_comes_from_its_longest_entry(tokenizer: PreTrainedTokenizerFast) -> None:
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    longest = max(len(entry) for entry in [*spec["model"]["vocab"], *(t["content"] for t in spec["added_tokens"])])
    assert prompt_char_limit(tokenizer) == 64 * longest


def test_no_text_has_more_characters_per_token_than_the_bound(tokenizer: PreTrainedTokenizerFast) -> None:
    """Texts built to pack many characters into few tokens: the longest tokens (special ones too), runs of one
    character, multi-byte characters, whitespace; each has at least len / chars_per_token tokens."""
    chars_per_token = max_chars_per_token(json.loads(tokenizer.backend_tokenizer.to_str()))
    assert chars_per_token is not None
    pieces = [tokenizer.decode([token_id]) for token_id in range(len(tokenizer))]
    pieces += ["<|begin_of_text|>", " ", "\n", "é", "😀", "\u0301", "a", "the"]
    rng = random.Random(0)
    longest_first = sorted(pieces, key=len, reverse=True)[:50]
    texts = [piece * 50 for piece in longest_first] + ["".join(rng.choices(pieces, k=200)) for _ in range(200)]
    for text in texts:
        assert len(tokenizer.encode(text, add_special_tokens=False)) * chars_per_token >= len(text), text[:80]


def test_a_prompt_past_the_bound_is_refused_before_tokenizing(tokenizer: PreTrainedTokenizerFast) -> None:
    limit = prompt_char_limit(tokenizer)
    assert limit is not None
    check_prompt_chars(tokenizer, "a" * limit, "prompt")
    started = time.perf_counter()
    with pytest.raises(APIError) as refused:
        check_prompt_chars(tokenizer, "a" * 4_000_000, "prompt")
    assert time.perf_counter() - started < 0.05
    assert (refused.value.info.param, refused.value.info.code) == ("prompt", "context_length_exceeded")
