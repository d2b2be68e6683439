"""steering/sae_math.py against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from steering.sae import SAE
from steering.sae_config import SAEConfig
from steering.sae_math import decode, encode, steering_direction, top_k_activations
from tests.steering.sae_folders import random_tensors

# d_in 2, d_sae 3: small enough to encode by hand.
W_ENC = torch.tensor([[1.0, -1.0, 2.0], [0.5, 1.0, -1.0]])
W_DEC = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, -1.0]])
B_ENC = torch.tensor([0.0, -0.5, 0.25])
B_DEC = torch.tensor([1.0, -1.0])
X = torch.tensor([[3.0, 1.0], [-1.0, 2.0]])  # [2 tokens, d_in]


def hand_sae(architecture: str = "standard", apply_b_dec: bool = True, **config: object) -> SAE:
    cfg = SAEConfig(
        d_in=2,
        d_sae=3,
        hook_name="blocks.0.hook_resid_post",
        architecture=architecture,
        apply_b_dec_to_input=apply_b_dec,
        **config,
    )
    threshold = torch.tensor([2.5, 0.0, 0.1]) if architecture == "jumprelu" else None
    return SAE(cfg, W_ENC, W_DEC, B_ENC, B_DEC, threshold)


def test_standard_encode_subtracts_b_dec_then_relu() -> None:
    # x - b_dec = [2, 2] and [-2, 3]; pre = [3, -0.5, 2.25] and [-0.5, 4.5, -6.75]
    assert torch.equal(encode(hand_sae(), X), torch.tensor([[3.0, 0.0, 2.25], [0.0, 4.5, 0.0]]))


def test_standard_encode_without_b_dec_on_input() -> None:
    # pre = [3.5, -2.5, 5.25] and [0, 2.5, -3.75]
    assert torch.equal(encode(hand_sae(apply_b_dec=False), X), torch.tensor([[3.5, 0.0, 5.25], [0.0, 2.5, 0.0]]))


def test_jumprelu_zeroes_features_at_or_below_threshold() -> None:
    # thresholds [2.5, 0, 0.1]: 3 > 2.5 stays, 2.25 > 0.1 stays, 4.5 > 0 stays
    assert torch.equal(encode(hand_sae("jumprelu"), X), torch.tensor([[3.0, 0.0, 2.25], [0.0, 4.5, 0.0]]))
    sae = hand_sae("jumprelu")
    higher = SAE(sae.config, W_ENC, W_DEC, B_ENC, B_DEC, torch.tensor([3.0, 5.0, 0.1]))
    assert torch.equal(encode(higher, X), torch.tensor([[0.0, 0.0, 2.25], [0.0, 0.0, 0.0]]))


def test_topk_keeps_k_largest_and_relus_them() -> None:
    # pre [3, -0.5, 2.25] keeps 3; [-0.5, 4.5, -6.75] keeps 4.5
    assert torch.equal(encode(hand_sae("topk", k=1), X), torch.tensor([[3.0, 0.0, 0.0], [0.0, 4.5, 0.0]]))
    # k=2 keeps -0.5 in the second row, which relu turns into 0
    assert torch.equal(encode(hand_sae("topk", k=2), X), torch.tensor([[3.0, 0.0, 2.25], [0.0, 4.5, 0.0]]))


def test_topk_rescales_by_decoder_norm() -> None:
    # decoder norms [1, 2, sqrt(10)]: pre * norms = [3, -1, 7.115] -> keeps feature 2
    acts = encode(hand_sae("topk", k=1, rescale_acts_by_decoder_norm=True), X[:1])
    assert torch.allclose(acts, torch.tensor([[0.0, 0.0, 2.25 * math.sqrt(10)]]))
    reconstruction = decode(hand_sae("topk", k=1, rescale_acts_by_decoder_norm=True), acts)
    assert torch.allclose(reconstruction, torch.tensor([[2.25 * 3 + 1.0, -2.25 - 1.0]]))


def test_constant_norm_rescale_scales_input_to_sqrt_d_in() -> None:
    sae = hand_sae(normalize_activations="constant_norm_rescale", apply_b_dec=False)
    x = torch.tensor([[3.0, 4.0]])  # norm 5 -> scaled to norm sqrt(2)
    expected = (x * math.sqrt(2) / 5) @ W_ENC + B_ENC
    assert torch.allclose(encode(sae, x), expected.relu())


def test_layer_norm_standardizes_input() -> None:
    sae = hand_sae(normalize_activations="layer_norm", apply_b_dec=False)
    x = torch.tensor([[3.0, 1.0]])  # mean 2, unbiased std sqrt(2)
    normalized = torch.tensor([[1.0, -1.0]]) / (math.sqrt(2) + 1e-5)
    assert torch.allclose(encode(sae, x), (normalized @ W_ENC + B_ENC).relu())


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_encode_of_a_feature_subset_equals_those_columns(architecture: str) -> None:
    tensors = random_tensors(16, 64, seed=1, threshold=architecture == "jumprelu")
    config = SAEConfig(16, 64, "blocks.0.hook_resid_post", architecture, k=8 if architecture == "topk" else None)
    sae = SAE(config, **tensors)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(2))
    features = torch.tensor([3, 60, 0, 17])
    assert torch.allclose(encode(sae, x, features), encode(sae, x)[:, features], atol=1e-6)


def test_decode_is_acts_times_w_dec_plus_b_dec() -> None:
    acts = torch.tensor([[1.0, 0.5, 2.0]])
    assert torch.equal(decode(hand_sae(), acts), torch.tensor([[1 + 6 + 1.0, 1 - 2 - 1.0]]))


def test_steering_direction_sums_strength_times_decoder_rows() -> None:
    direction = steering_direction(hand_sae(), [(2, 0.5), (0, -2.0)])
    assert torch.equal(direction, torch.tensor([0.5 * 3 - 2.0, -0.5]))
    assert torch.equal(steering_direction(hand_sae(), []), torch.zeros(2))


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ([(3, 1.0)], r"outside \[0, 3\)"),
        ([(-1, 1.0)], r"outside \[0, 3\)"),
        ([(True, 1.0)], r"outside \[0, 3\)"),
        ([(1, 1.0), (1, 2.0)], "more than once"),
        ([(1, float("nan"))], "not a finite number"),
        ([(1, float("inf"))], "not a finite number"),
    ],
)
def test_steering_direction_refuses_bad_features(features: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        steering_direction(hand_sae(), features)


def test_top_k_activations_is_descending_with_global_indices() -> None:
    acts = torch.tensor([[0.0, 5.0, 1.0, 3.0], [2.0, 0.0, 4.0, 0.5]])
    values, indices = top_k_activations(acts, 2)
    assert torch.equal(values, torch.tensor([[5.0, 3.0], [4.0, 2.0]]))
    assert torch.equal(indices, torch.tensor([[1, 3], [2, 0]]))


def test_top_k_activations_within_a_subset_reports_indices_into_d_sae() -> None:
    acts = torch.tensor([[0.0, 5.0, 1.0, 3.0], [2.0, 0.0, 4.0, 0.5]])
    values, indices = top_k_activations(acts, 5, feature_subset=torch.tensor([3, 0]))
    assert torch.equal(values, torch.tensor([[3.0, 0.0], [2.0, 0.5]]))
    assert torch.equal(indices, torch.tensor([[3, 0], [0, 3]]))
    with pytest.raises(ValueError, match="top_k must be positive"):
        top_k_activations(acts, 0)
