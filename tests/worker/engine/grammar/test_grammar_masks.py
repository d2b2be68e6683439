"""The mask math: bit j of word w of a row's bitmask allows token 32 w + j of that row's logits."""

from __future__ import annotations

import torch
import xgrammar as xgr

from worker.engine.grammar.masks import mask_logits, rows_allowing_nothing, unpack_bitmask


def bitmask_allowing(allowed: list[list[int]], vocab_size: int) -> torch.Tensor:
    bitmask = torch.zeros(len(allowed), (vocab_size + 31) // 32, dtype=torch.int32)
    for row, tokens in enumerate(allowed):
        for token in tokens:
            word = int(bitmask[row, token // 32]) | (1 << (token % 32))
            bitmask[row, token // 32] = word - (1 << 32) if word >= 1 << 31 else word  # int32 wraps bit 31
    return bitmask


def test_unpack_reads_every_bit_including_the_sign_bit() -> None:
    allowed = [[0, 31, 32, 63, 64, 69], [5]]
    unpacked = unpack_bitmask(bitmask_allowing(allowed, 70), 70)
    assert unpacked.shape == (2, 70) and unpacked.dtype == torch.bool
    assert [torch.nonzero(row).flatten().tolist() for row in unpacked] == allowed


def test_unpack_drops_bits_past_the_vocabulary() -> None:
    full = torch.full((1, 2), -1, dtype=torch.int32)  # 64 bits set
    assert unpack_bitmask(full, 40).sum() == 40


def test_mask_logits_masks_only_the_named_rows_and_leaves_the_input_untouched() -> None:
    logits = torch.randn(4, 70)
    before = logits.clone()
    masked = mask_logits(logits, bitmask_allowing([[1, 2], [68]], 70), [1, 3])
    assert torch.equal(logits, before)
    assert torch.equal(masked[[0, 2]], logits[[0, 2]])
    assert torch.isfinite(masked[1]).nonzero().flatten().tolist() == [1, 2]
    assert torch.equal(masked[1, [1, 2]], logits[1, [1, 2]])
    assert torch.isfinite(masked[3]).nonzero().flatten().tolist() == [68]


def test_mask_logits_agrees_with_xgrammar_kernel() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 100, generator=generator)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 4), dtype=torch.int32, generator=generator)
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask)
    assert torch.equal(mask_logits(logits, bitmask, [0, 1, 2]), expected)


def test_rows_allowing_nothing_finds_empty_rows_and_rows_left_only_their_held_back_tokens() -> None:
    vocab_size = 70  # the last word has 6 bits inside the vocabulary
    bitmask = bitmask_allowing([[3], [], [5, 9], [68], [9]], vocab_size)
    bitmask[1, 2] = -(2**31)  # bit 31 of the last word: token 95, past the vocabulary
    suppressed = [(), (), (9,), (68,), (9,)]
    assert rows_allowing_nothing(bitmask, vocab_size, suppressed) == [1, 3, 4]
    assert rows_allowing_nothing(bitmask, vocab_size, [()] * 5) == [1]
