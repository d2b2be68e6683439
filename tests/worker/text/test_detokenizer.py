from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from worker.text.detokenizer import IncrementalDetokenizer

MULTI_BYTE_TEXTS = ["héllo 日本 🙂", "The quick brown fox, naïve café — 🙂🙂 done."]
TEXTS = [*MULTI_BYTE_TEXTS, "a"]


def byte_tokenizer() -> Tokenizer:
    """One token per byte, so every multi-byte character is split across tokens."""
    vocab = {char: index for index, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def stream_one_at_a_time(tokenizer: PreTrainedTokenizerBase | Tokenizer, token_ids: list[int]) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer)
    return [detokenizer.push([token_id]) for token_id in token_ids]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("text", MULTI_BYTE_TEXTS)
def test_split_characters_are_emitted_whole(text: str) -> None:
    tokenizer = byte_tokenizer()
    token_ids = tokenizer.encode(text).ids
    assert len(token_ids) == len(text.encode())
    chunks = stream_one_at_a_time(tokenizer, token_ids)
    assert "".join(chunks) == text
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert "" in chunks  # a character's leading bytes produced nothing yet


def test_transformers_fast_tokenizer_is_accepted() -> None:
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer())
    assert "".join(stream_one_at_a_time(tokenizer, tokenizer.encode(TEXTS[0]))) == TEXTS[0]


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_model_tokenizer_matches_decode(tiny_tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    token_ids = [*tiny_tokenizer.encode(text, add_special_tokens=False), tiny_tokenizer.eos_token_id]
    chunks = stream_one_at_a_time(tiny_tokenizer, token_ids)
    assert "".join(chunks) == tiny_tokenizer.decode(token_ids, skip_special_tokens=True)
    assert chunks[-1] == ""
    assert all("\ufffd" not in chunk for chunk in chunks)


def test_push_takes_several_tokens_at_once(tiny_tokenizer: PreTrainedTokenizerBase) -> None:
    token_ids = tiny_tokenizer.encode(TEXTS[1], add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tiny_tokenizer)
    text = "".join(detokenizer.push(token_ids[start : start + 3]) for start in range(0, len(token_ids), 3))
    assert text == tiny_tokenizer.decode(token_ids, skip_special_tokens=True)


def metaspace_tokenizer() -> Tokenizer:
    """SentencePiece-style: '▁' marks a word start and the decoder strips it at the very start of a text."""
    vocab = {"<unk>": 0, "▁the": 1, "▁cat": 2, "▁sat": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return tokenizer


def test_completion_keeps_its_leading_space_after_the_prompt() -> None:
    tokenizer = metaspace_tokenizer()
    prompt = tokenizer.encode("the cat").ids
    assert IncrementalDetokenizer(tokenizer).push([3]) == "sat"  # no context: the space is lost
    assert IncrementalDetokenizer(tokenizer, prompt).push([3]) == " sat"


def test_special_tokens_show_when_not_skipped(tiny_tokenizer: PreTrainedTokenizerBase) -> None:
    token_ids = [*tiny_tokenizer.encode("a dog", add_special_tokens=False), tiny_tokenizer.eos_token_id]
    shown = IncrementalDetokenizer(tiny_tokenizer, skip_special_tokens=False).push(token_ids)
    assert shown == tiny_tokenizer.decode(token_ids) and shown.endswith(tiny_tokenizer.eos_token)
    assert IncrementalDetokenizer(tiny_tokenizer).push(token_ids) == tiny_tokenizer.decode(token_ids[:-1])


def test_byte_zero_shows_as_the_replacement_character(tiny_tokenizer: PreTrainedTokenizerBase) -> None:
    # PostgreSQL cannot store U+0000 and a recording that failed left its request unfinished
    nul_id = tiny_tokenizer.convert_tokens_to_ids(bytes_to_unicode()[0])
    assert tiny_tokenizer.decode([nul_id]) == "\x00"  # what the tokenizer itself writes
    text = "".join(stream_one_at_a_time(tiny_tokenizer, [*tiny_tokenizer.encode("a"), nul_id, nul_id]))
    assert text == "a\ufffd\ufffd"
