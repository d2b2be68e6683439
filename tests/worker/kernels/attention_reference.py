"""The attention every kernel must compute, written out plainly: one chunk's queries over its row's keys, with a layer's
variant (scale, sliding window, soft-cap, sinks) applied as HF's eager attention applies them."""

from __future__ import annotations

import torch

from worker.kernels.layer_variant import LayerVariant

# (sliding window, soft-cap, sinks): each variant alone and all at once; a window of 21 starts mid-block
VARIANTS = [(21, None, False), (None, 0.8, False), (None, None, True), (21, 0.8, True)]


def layer_variant(
    scale: float, num_heads: int, window: int | None, softcap: float | None, has_sinks: bool, device: str = "cpu"
) -> LayerVariant:
    """The variant, with sinks drawn around the scores' size so that they weigh in the softmax."""
    sinks = torch.randn(num_heads).to(device) if has_sinks else None
    return LayerVariant(scale, window, softcap, sinks)


def reference_attention(
    queries: torch.Tensor,  # [n, H, D] a chunk's queries
    keys: torch.Tensor,  # [Hkv, blocks, block_size, D]
    values: torch.Tensor,  # [Hkv, blocks, block_size, D]
    table: torch.Tensor,  # [W] the row's blocks
    context_start: int,  # the chunk's first query's position in its row
    variant: LayerVariant,
) -> torch.Tensor:
    """[n, H, D] float32: query i (at position context_start + i) over the row's keys it sees."""
    end = context_start + queries.shape[0]
    k, v = (cache[:, table.long()].flatten(1, 2)[:, :end].float() for cache in (keys, values))  # [Hkv, end, D]
    group = queries.shape[1] // keys.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)  # [H, end, D]
    scores = queries.float().transpose(0, 1) @ k.transpose(1, 2) * variant.scale  # [H, n, end]
    if variant.softcap is not None:
        scores = torch.tanh(scores / variant.softcap) * variant.softcap
    positions = torch.arange(context_start, end, device=keys.device)[:, None]
    key_positions = torch.arange(end, device=keys.device)[None, :]
    visible = key_positions <= positions
    if variant.sliding_window is not None:
        visible &= key_positions > positions - variant.sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    if variant.sinks is not None:
        sinks = variant.sinks.float().to(keys.device).view(-1, 1, 1).expand(-1, scores.shape[1], 1)
        scores = torch.cat([scores, sinks], dim=-1)
    probs = scores.softmax(dim=-1)[..., :end]
    return (probs @ v).transpose(0, 1)
