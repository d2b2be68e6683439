"""Attention for a packed forward of whole inputs with no KV pool: each input attends causally over its own keys,
under the layer's variant (sliding window, soft-cap, sinks), with the same SDPA or written-out arithmetic a first
prefill chunk runs through (`prefill_attention`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.attention.gather_attention import prefill_attention
from worker.kernels.layer_variant import LayerVariant


@dataclass(frozen=True)
class PackedInputs:
    """The packed sequence's inputs, one after another: input i takes the next lengths[i] tokens."""

    lengths: tuple[int, ...]

    @property
    def spans(self) -> list[slice]:
        spans, start = [], 0
        for length in self.lengths:
            spans.append(slice(start, start + length))
            start += length
        return spans


def packed_attention(
    query: torch.Tensor,  # [1, H, N, D]
    key: torch.Tensor,  # [1, Hkv, N, D]
    value: torch.Tensor,  # [1, Hkv, N, D]
    variant: LayerVariant,
    packed: PackedInputs,
) -> torch.Tensor:
    """[N, H, D]: every input's causal attention over its own tokens."""
    output = torch.empty(query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype, device=query.device)
    for span in packed.spans:
        mask = window_mask(span.stop - span.start, variant.sliding_window, query.device)
        attended = prefill_attention(query[:, :, span], key[:, :, span], value[:, :, span], mask, variant)
        output[span] = attended[0].transpose(0, 1)
    return output


def window_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """[length, length] True where query i sees key j (j <= i and i - j < window, as HF's sliding mask); None when
    the window reaches the whole input: plain causal."""
    if window is None or window >= length:
        return None
    positions = torch.arange(length, device=device)
    distance = positions[:, None] - positions[None, :]
    return (distance >= 0) & (distance < window)
