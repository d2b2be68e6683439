"""Token bitmasks applied to logits: pure tensor math, the same on every device."""

from __future__ import annotations

import torch

BITS_PER_WORD = 32
NEG_INF = float("-inf")


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[G, W] int32 -> [G, vocab_size] bool: token t is allowed when bit t % 32 of word t // 32 is set."""
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [G, W, 32]; the arithmetic shift keeps bit 31's sign, & 1 drops it
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def mask_logits(logits: torch.Tensor, bitmask: torch.Tensor, row_indices: list[int]) -> torch.Tensor:
    """`logits` [S, V] with the disallowed tokens of rows `row_indices` (ascending; bitmask row i for logits row
    row_indices[i]) at -inf; the other rows untouched. Out of place: the caller's logits stay raw."""
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[-1])  # [G, V]
    if len(row_indices) < logits.shape[0]:  # some rows are free: they allow every token
        every_row = torch.ones_like(logits, dtype=torch.bool)
        every_row[torch.tensor(row_indices, dtype=torch.long, device=logits.device)] = allowed
        allowed = every_row
    # one pass over [S, V]; masked_fill with a scalar measured twice as slow on a CPU thread
    return torch.where(allowed, logits, NEG_INF)


def rows_allowing_nothing(bitmask: torch.Tensor, vocab_size: int, suppressed: list[tuple[int, ...]]) -> list[int]:
    """The rows of `bitmask` [G, W] (on the CPU) that allow no token below `vocab_size` once row i's
    `suppressed[i]` (stop tokens held back until min_tokens) are taken out: a grammar that dead-ends there, which
    every row's check on its words finds without unpacking the masks."""
    num_full_words, num_tail_bits = divmod(vocab_size, BITS_PER_WORD)
    is_allowing = bitmask[:, :num_full_words].any(dim=1)  # [G]
    if num_tail_bits:  # the last word's bits past the vocabulary allow nothing
        is_allowing |= (bitmask[:, num_full_words] & ((1 << num_tail_bits) - 1)) != 0
    empty = []
    for row, is_any in enumerate(is_allowing.tolist()):
        if is_any and suppressed[row]:
            allowed = unpack_bitmask(bitmask[row : row + 1], vocab_size)[0]  # [V]
            allowed[list(suppressed[row])] = False
            is_any = bool(allowed.any())
        if not is_any:
            empty.append(row)
    return empty
