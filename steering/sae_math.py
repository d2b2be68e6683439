"""The SAE math as pure functions: encode, decode, steering directions, top-k feature activations.

Matches SAELens' inference SAEs (StandardSAE, TopKSAE, JumpReLUSAE) for the architectures we load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from steering.sae import SAE

LAYER_NORM_EPS = 1e-5  # SAELens' run-time layer_norm epsilon


def normalize_input(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """The SAE's run-time input normalization (its cfg's normalize_activations), then b_dec if it asks."""
    mode = sae.config.normalize_activations
    if mode == "constant_norm_rescale":
        x = x * (sae.config.d_in**0.5 / x.norm(dim=-1, keepdim=True))
    elif mode == "layer_norm":
        x = x - x.mean(dim=-1, keepdim=True)
        x = x / (x.std(dim=-1, keepdim=True) + LAYER_NORM_EPS)
    if sae.config.apply_b_dec_to_input:
        x = x - sae.b_dec
    return x


def encode(sae: SAE, x: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
    """Feature activations [..., d_sae] of x [..., d_in]; with `features` [F], only those: [..., F].

    Standard and JumpReLU SAEs compute a feature subset without the rest; top-k must see all of them.
    """
    sae_in = normalize_input(sae, x.to(sae.dtype))
    architecture = sae.config.architecture
    if architecture == "topk":
        acts = _topk_acts(sae, sae_in @ sae.W_enc + sae.b_enc)
        return acts if features is None else acts.index_select(-1, features)
    W_enc, b_enc, threshold = sae.W_enc, sae.b_enc, sae.threshold
    if features is not None:
        W_enc, b_enc = W_enc.index_select(1, features), b_enc.index_select(0, features)
        threshold = None if threshold is None else threshold.index_select(0, features)
    hidden_pre = sae_in @ W_enc + b_enc  # [..., d_sae or F]
    if architecture == "jumprelu":
        return hidden_pre.relu() * (hidden_pre > threshold.relu())
    return hidden_pre.relu()


def _topk_acts(sae: SAE, hidden_pre: torch.Tensor) -> torch.Tensor:
    if sae.config.rescale_acts_by_decoder_norm:
        hidden_pre = hidden_pre * sae.W_dec.norm(dim=-1)
    values, indices = hidden_pre.topk(sae.config.k, dim=-1, sorted=False)
    return torch.zeros_like(hidden_pre).scatter_(-1, indices, values.relu())


def decode(sae: SAE, acts: torch.Tensor) -> torch.Tensor:
    """Reconstruction [..., d_in] of feature activations [..., d_sae], in the SAE's (normalized) input space."""
    if sae.config.architecture == "topk" and sae.config.rescale_acts_by_decoder_norm:
        acts = acts / sae.W_dec.norm(dim=-1)
    return acts @ sae.W_dec + sae.b_dec


def validate_features(features: Sequence[tuple[int, float]], d_sae: int) -> None:
    """Raises ValueError for an index outside [0, d_sae), a repeated index, or a strength that is not finite."""
    seen: set[int] = set()
    for index, strength in features:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < d_sae:
            raise ValueError(f"feature index {index!r} is outside [0, {d_sae})")
        if index in seen:
            raise ValueError(f"feature index {index} appears more than once")
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
            raise ValueError(f"feature {index}: strength {strength!r} is not a finite number")
        seen.add(index)


def steering_direction(sae: SAE, features: Sequence[tuple[int, float]]) -> torch.Tensor:
    """Σ strength · W_dec[index] as a [d_in] vector in the SAE's dtype; an empty list gives zeros."""
    validate_features(features, sae.config.d_sae)
    if not features:
        return torch.zeros(sae.config.d_in, device=sae.device, dtype=sae.dtype)
    indices = torch.tensor([index for index, _ in features], device=sae.device)
    strengths = torch.tensor([float(strength) for _, strength in features], device=sae.device)  # [F] float32
    # Summed in float32 so a bfloat16 SAE does not lose the small strengths against the large ones.
    direction = strengths @ sae.W_dec.index_select(0, indices).float()  # [d_in]
    return direction.to(sae.dtype)


def top_k_activations(
    acts: torch.Tensor, k: int, feature_subset: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest activations per position of acts [P, d_sae] (or only among feature_subset [F]).

    Returns values [P, k'] (descending) and their feature indices [P, k'] into d_sae, k' = min(k, features).
    """
    if k <= 0:
        raise ValueError(f"top_k must be positive, got {k}")
    candidates = acts if feature_subset is None else acts.index_select(-1, feature_subset)
    values, positions = candidates.topk(min(k, candidates.shape[-1]), dim=-1)
    indices = positions if feature_subset is None else feature_subset[positions]
    return values, indices
