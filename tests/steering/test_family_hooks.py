"""BatchHooks at every hook point of every family equal a reference hook written directly on HF's modules, in
float32: what a monitor reads there, and what steering one row there does to the logits (the other row untouched).
The residual sites are checked against each other too: resid_mid is resid_pre plus attention's output, and
resid_post is resid_mid plus the MLP's (Granite scaling both by its residual multiplier; GPT-NeoX adding both to
resid_pre at once)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from transformers import PreTrainedModel

from steering.batch_hooks import BatchHooks
from steering.hook_points import ATTN_OUT, MLP_OUT, RESID_MID, RESID_POST, RESID_PRE, HookPoint, point_width
from steering.model_layout import ModelLayout
from steering.sae import SAE
from steering.sae_config import SAEConfig
from steering.sae_math import encode, top_k_activations
from steering.step_plan import MonitorTap, StepPlan, build_steering_table
from tests.steering.reference_hooks import READ_SITES, reference_hook, reference_module
from tests.steering.sae_folders import random_tensors
from tests.worker.family_configs import FAMILIES, build_family_model

LAYER = 1
LENGTH = 12  # tokens per row; two rows


def add_to_second_row(delta: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    def edit(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])  # [2 * LENGTH, width]
        added = torch.zeros_like(flat)
        added[LENGTH:] = delta
        return (flat + added).view(hidden.shape)

    return edit


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(family: str) -> PreTrainedModel:
    return build_family_model(family)


@pytest.fixture
def hooks(model: PreTrainedModel) -> Iterator[BatchHooks]:
    hooks = BatchHooks(ModelLayout.of(model))
    yield hooks
    hooks.close()


@pytest.fixture(scope="module")
def input_ids() -> torch.Tensor:
    return torch.randint(6, 2048, (2, LENGTH), generator=torch.Generator().manual_seed(3))  # [2, LENGTH]


def token_rows() -> torch.Tensor:
    return torch.arange(2).repeat_interleave(LENGTH)  # [N]: row 0's tokens, then row 1's


def run(model: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=input_ids).logits  # [2, LENGTH, V]


def random_sae(width: int) -> SAE:
    return SAE(SAEConfig(width, 32, "blocks.0.hook_resid_pre"), **random_tensors(width, 32, seed=width))


@pytest.mark.parametrize("site", READ_SITES)
def test_monitors_read_what_a_reference_hook_reads(
    family: str, site: str, model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor
) -> None:
    point = HookPoint(LAYER, site)
    width = point_width(hooks.layout, point)
    seen: list[torch.Tensor] = []
    handle = reference_hook(*reference_module(model, family, LAYER, site), lambda hidden: seen.append(hidden) or hidden)
    sae = random_sae(width)
    positions = torch.arange(2 * LENGTH)
    captured = torch.zeros(2 * LENGTH, width)
    hooks.set_step(StepPlan(monitors={point: [MonitorTap("all", sae, positions, 3)]}, captures={point: captured}))
    run(model, input_ids)
    result = hooks.take_monitor_results()["all"]
    hooks.clear()
    handle.remove()
    expected = seen[0].reshape(-1, width)  # [N, width]
    assert torch.equal(captured, expected)
    values, indices = top_k_activations(encode(sae, expected), 3)
    assert torch.equal(result.values, values) and torch.equal(result.indices, indices)


@pytest.mark.parametrize("site", READ_SITES)
def test_steering_one_row_equals_a_reference_hook(
    family: str, site: str, model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor
) -> None:
    point = HookPoint(LAYER, site)
    delta = torch.randn(point_width(hooks.layout, point), generator=torch.Generator().manual_seed(5))
    plain = run(model, input_ids)
    handle = reference_hook(*reference_module(model, family, LAYER, site), add_to_second_row(delta))
    expected = run(model, input_ids)
    handle.remove()
    hooks.set_step(StepPlan(steering={point: build_steering_table(token_rows(), [None, delta], torch.float32)}))
    steered = run(model, input_ids)
    hooks.clear()
    torch.testing.assert_close(steered[0], plain[0], rtol=0, atol=1e-5)  # MoE layers batch tokens per expert
    assert not torch.allclose(steered[1], plain[1])
    torch.testing.assert_close(steered, expected, rtol=0, atol=1e-5)


def read_residual_sites(hooks: BatchHooks, model: PreTrainedModel, input_ids: torch.Tensor, plan: StepPlan) -> dict:
    """Every residual-side site of layer LAYER, [N, hidden] each, under `plan`'s steering."""
    sites = [
        site
        for site in (RESID_PRE, ATTN_OUT, RESID_MID, MLP_OUT, RESID_POST)
        if site != RESID_MID or hooks.layout.has_resid_mid
    ]
    captures = {HookPoint(LAYER, site): torch.zeros(2 * LENGTH, hooks.layout.hidden_size) for site in sites}
    hooks.set_step(StepPlan(steering=plan.steering, captures=captures))
    run(model, input_ids)
    hooks.clear()
    return {point.site: captured for point, captured in captures.items()}


def test_resid_mid_and_post_add_up_from_the_sublayers(
    family: str, model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor
) -> None:
    read = read_residual_sites(hooks, model, input_ids, StepPlan())
    scale = hooks.layout.residual_multiplier
    if family == "gpt_neox":  # parallel: attention and MLP both read resid_pre
        torch.testing.assert_close(read[RESID_POST], read[RESID_PRE] + read[ATTN_OUT] + read[MLP_OUT])
        return
    torch.testing.assert_close(read[RESID_MID], read[RESID_PRE] + scale * read[ATTN_OUT])
    torch.testing.assert_close(read[RESID_POST], read[RESID_MID] + scale * read[MLP_OUT])


def test_steering_resid_mid_moves_the_residual_between_attention_and_mlp_by_the_delta(
    family: str, model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor
) -> None:
    if not hooks.layout.has_resid_mid:
        pytest.skip(f"{family}'s layers have no resid_mid")
    point = HookPoint(LAYER, RESID_MID)
    delta = torch.randn(hooks.layout.hidden_size, generator=torch.Generator().manual_seed(7))
    plain = read_residual_sites(hooks, model, input_ids, StepPlan())
    table = build_steering_table(token_rows(), [None, delta], torch.float32)
    steered = read_residual_sites(hooks, model, input_ids, StepPlan(steering={point: table}))
    moved = steered[RESID_MID] - plain[RESID_MID]
    assert torch.equal(moved[:LENGTH], torch.zeros(LENGTH, delta.shape[0]))
    torch.testing.assert_close(moved[LENGTH:], delta.expand(LENGTH, -1), rtol=0, atol=1e-5)
    torch.testing.assert_close(steered[ATTN_OUT], plain[ATTN_OUT])  # attn_out reads before resid_mid's delta
    torch.testing.assert_close(steered[RESID_PRE], plain[RESID_PRE])
