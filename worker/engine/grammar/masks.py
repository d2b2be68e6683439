"""Token bitmasks applied to logits: pure tensor math, the same on every device."""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[G, W] int32 -> [G, vocab_size] bool: token t is allowed when bit t % 32 of word t // 32 is set."""
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [G, W, 32]; the arithmetic shift keeps bit 31's sign, & 1 drops it
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def mask_logits(logits: torch.Tensor, bitmask: torch.Tensor, row_indices: list[int]) -> torch.Tensor:
    """`logits` [S, V] with the disallowed tokens of rows `row_indices` (bitmask row i for logits row
    row_indices[i]) at -inf; the other rows untouched. Out of place: the caller's logits stay raw."""
    index = torch.tensor(row_indices, dtype=torch.long, device=logits.device)
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), logits.shape[-1])  # [G, V]
    masked = logits.index_select(0, index).masked_fill(~allowed, float("-inf"))
    return logits.index_copy(0, index, masked)
