"""How one layer attends beyond plain causal attention: what every attention kernel takes besides Q, K and V.

HF's attention modules pass their layer's variant to the attention function at every call: `scaling` (Gemma's
query_pre_attn_scalar), `sliding_window` (Mistral, Mixtral, Qwen3-MoE, and alternating layers of Gemma 2 and 3,
gpt-oss and Qwen2), `softcap` (Gemma 2's attention-logit soft-cap) and `s_aux` (gpt-oss's per-head attention sinks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerVariant:
    scale: float  # of the scores q . k
    sliding_window: int | None = None  # a query sees the `sliding_window` latest keys, itself included; None: all
    softcap: float | None = None  # scores become softcap * tanh(score / softcap), before masking
    sinks: torch.Tensor | None = None  # [H] logits that join each query head's softmax as a key with no value

    def first_key(self, position: int) -> int:
        """The first key position a query at `position` sees (HF's sliding mask: key > position - window)."""
        return 0 if self.sliding_window is None else max(0, position - self.sliding_window + 1)
