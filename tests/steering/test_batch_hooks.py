"""steering/batch_hooks.py on the real tiny model: per-row steering and monitoring in one forward pass."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from steering.batch_hooks import BatchHooks
from steering.hook_points import RESID_POST, RESID_PRE, HookPoint, check_sae_fits
from steering.model_layout import LLAMA_LAYOUT, ModelLayout
from steering.registry import SAERegistry
from steering.running_stats import RunningFeatureStats
from steering.sae import SAE
from steering.sae_math import encode, steering_direction, top_k_activations
from steering.step_plan import MonitorTap, StatsTap, SteeringTable, StepPlan, build_steering_table
from tests.steering.sae_folders import TINY_SAE_ID

TEXTS = ["The old man walked to the market and bought", "Cats are small furry animals. They like", "Anna found a red"]


@pytest.fixture(scope="module")
def input_ids(tiny_model_dir: Path) -> torch.Tensor:
    """Three different texts cut to one length, so a plain [3, L] batch needs no padding."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    rows = [tokenizer.encode(text) for text in TEXTS]
    length = min(len(row) for row in rows)
    return torch.tensor([row[:length] for row in rows])  # [3, L]


@pytest.fixture(scope="module")
def sae(tiny_sae_root: Path) -> SAE:
    return SAERegistry(tiny_sae_root).get(TINY_SAE_ID)


@pytest.fixture
def hooks(tiny_model: PreTrainedModel) -> Iterator[BatchHooks]:
    hooks = BatchHooks(ModelLayout.of(tiny_model))
    yield hooks
    hooks.close()


def logits(model: PreTrainedModel, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=input_ids).logits  # [B, L, V]


def packed_rows(num_tokens: list[int]) -> torch.Tensor:
    """token_rows [N] as the engine's step has it: the row of each packed token."""
    return torch.repeat_interleave(torch.arange(len(num_tokens)), torch.tensor(num_tokens))


def steer_row(input_ids: torch.Tensor, row: int, delta: torch.Tensor) -> SteeringTable:
    num_rows, length = input_ids.shape
    deltas = [delta if index == row else None for index in range(num_rows)]
    return build_steering_table(packed_rows([length] * num_rows), deltas, torch.float32)


def demo_direction(sae: SAE, steering_demo: dict) -> tuple[torch.Tensor, int]:
    feature = steering_demo["features"][0]
    return steering_direction(sae, [(feature["index"], feature["strength"])]), feature["token_id"]


def test_unsteered_rows_are_bit_identical_to_a_run_without_hooks(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE, steering_demo: dict
) -> None:
    plain = logits(tiny_model, input_ids)
    direction, _ = demo_direction(sae, steering_demo)
    hooks.set_step(StepPlan(steering={HookPoint(2, RESID_POST): steer_row(input_ids, 1, direction)}))
    steered = logits(tiny_model, input_ids)
    hooks.clear()
    assert torch.equal(steered[0], plain[0]) and torch.equal(steered[2], plain[2])
    assert not torch.allclose(steered[1], plain[1])


def test_steering_raises_the_features_token(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE, steering_demo: dict
) -> None:
    plain = logits(tiny_model, input_ids)
    direction, token_id = demo_direction(sae, steering_demo)
    hooks.set_step(
        StepPlan(steering={check_sae_fits(ModelLayout.of(tiny_model), sae.config): steer_row(input_ids, 1, direction)})
    )
    steered = logits(tiny_model, input_ids)
    hooks.clear()
    assert bool((steered[1, :, token_id] > plain[1, :, token_id] + 1.0).all())
    assert steered[1, -1].argmax().item() == token_id
    assert plain[1, -1].argmax().item() != token_id


def test_packed_single_sequence_is_steered_the_same_way(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE, steering_demo: dict
) -> None:
    direction, token_id = demo_direction(sae, steering_demo)
    packed = input_ids[1:2]  # [1, N]: the engine's layout, one request
    table = build_steering_table(packed_rows([packed.shape[1]]), [direction], torch.float32)
    hooks.set_step(StepPlan(steering={HookPoint(2, RESID_POST): table}))
    steered = logits(tiny_model, packed)
    hooks.clear()
    assert steered[0, -1].argmax().item() == token_id


def test_steering_layer_input_equals_steering_previous_layer_output(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE, steering_demo: dict
) -> None:
    direction, _ = demo_direction(sae, steering_demo)
    table = steer_row(input_ids, 0, direction)
    hooks.set_step(StepPlan(steering={HookPoint(2, RESID_POST): table}))
    after_layer_2 = logits(tiny_model, input_ids)
    hooks.set_step(StepPlan(steering={HookPoint(3, RESID_PRE): table}))
    before_layer_3 = logits(tiny_model, input_ids)
    hooks.clear()
    assert torch.equal(after_layer_2, before_layer_3)


def test_monitor_top_k_equals_encoding_the_hidden_states_directly(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE
) -> None:
    length = input_ids.shape[1]
    all_of_row_0 = torch.arange(length)
    last_of_row_2 = torch.tensor([3 * length - 1])
    subset = torch.tensor([5, 100, 200, 300, 400, 500])
    taps = [MonitorTap("a", sae, all_of_row_0, top_k=5), MonitorTap("b", sae, last_of_row_2, 3, subset)]
    hooks.set_step(StepPlan(monitors={HookPoint(2, RESID_POST): taps}))
    logits(tiny_model, input_ids)
    results = hooks.take_monitor_results()
    hooks.clear()
    with torch.inference_mode():
        hidden = tiny_model(input_ids=input_ids, output_hidden_states=True).hidden_states[3].reshape(-1, 128)
    for tap in taps:
        values, indices = top_k_activations(encode(sae, hidden[tap.positions]), tap.top_k, tap.features)
        assert torch.equal(results[tap.key].indices, indices)
        assert torch.allclose(results[tap.key].values, values, atol=1e-5)
    assert results["a"].values.shape == (length, 5)
    assert set(results["b"].indices.flatten().tolist()) <= set(subset.tolist())
    assert hooks.take_monitor_results() == {}


def test_a_steered_request_sees_its_feature_fire_while_a_neighbour_does_not(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE, steering_demo: dict
) -> None:
    direction, _ = demo_direction(sae, steering_demo)
    length = input_ids.shape[1]
    point = HookPoint(2, RESID_POST)
    taps = [
        MonitorTap(key, sae, torch.tensor([(row + 1) * length - 1]), top_k=3) for key, row in (("r0", 0), ("r1", 1))
    ]
    hooks.set_step(StepPlan(steering={point: steer_row(input_ids, 1, direction)}, monitors={point: taps}))
    logits(tiny_model, input_ids)
    results = hooks.take_monitor_results()
    hooks.clear()
    assert results["r1"].indices[0, 0].item() == steering_demo["features"][0]["index"]
    assert steering_demo["features"][0]["index"] not in results["r0"].indices.tolist()[0]


def test_stats_tap_accumulates_chosen_features_over_every_token(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE
) -> None:
    stats = RunningFeatureStats(TINY_SAE_ID, [7, 3, 400])
    hooks.set_step(StepPlan(stats={HookPoint(2, RESID_POST): [StatsTap(sae, stats)]}))
    logits(tiny_model, input_ids)
    hooks.clear()
    with torch.inference_mode():
        hidden = tiny_model(input_ids=input_ids, output_hidden_states=True).hidden_states[3].reshape(-1, 128)
    acts = encode(sae, hidden)[:, [7, 3, 400]]
    snapshot = stats.snapshot()
    assert snapshot["count"] == input_ids.numel()
    assert [feature["index"] for feature in snapshot["features"]] == [7, 3, 400]
    assert [feature["max"] for feature in snapshot["features"]] == pytest.approx(acts.amax(0).tolist(), abs=1e-5)


def test_without_a_plan_the_hooks_change_nothing(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor, sae: SAE, steering_demo: dict
) -> None:
    plain = logits(tiny_model, input_ids)
    direction, _ = demo_direction(sae, steering_demo)
    table = steer_row(input_ids, 1, direction)
    hooks.set_step(StepPlan(steering={HookPoint(1, RESID_PRE): table, HookPoint(2, RESID_POST): table}))
    hooks.clear()
    assert hooks.installed == {HookPoint(1, RESID_PRE), HookPoint(2, RESID_POST)}
    assert torch.equal(logits(tiny_model, input_ids), plain)
    hooks.set_step(StepPlan(steering={HookPoint(1, RESID_PRE): table}))
    hooks.close()
    assert torch.equal(logits(tiny_model, input_ids), plain)


def test_a_table_for_another_step_size_is_refused(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor
) -> None:
    table = build_steering_table(packed_rows([4]), [torch.ones(128)], torch.float32)
    hooks.set_step(StepPlan(steering={HookPoint(0, RESID_POST): table}))
    with pytest.raises(ValueError, match="steering table covers 4 tokens, the step has"):
        logits(tiny_model, input_ids)
    hooks.clear()


def test_build_steering_table_maps_tokens_to_their_requests_delta() -> None:
    first, second = torch.full((4,), 1.0), torch.full((4,), 2.0)
    table = build_steering_table(packed_rows([2, 3, 1, 2]), [None, first, None, second], torch.float64)
    assert torch.equal(table.deltas, torch.stack([torch.zeros(4), first, torch.zeros(4), second]).double())
    assert table.apply(torch.zeros(8, 4, dtype=torch.float64))[:, 0].tolist() == [0, 0, 1, 1, 1, 0, 2, 2]
    assert build_steering_table(packed_rows([2, 3]), [None, None], torch.float32) is None


def test_a_table_in_another_dtype_is_refused(
    tiny_model: PreTrainedModel, hooks: BatchHooks, input_ids: torch.Tensor
) -> None:
    table = build_steering_table(packed_rows([input_ids.numel()]), [torch.ones(128)], torch.float64)
    hooks.set_step(StepPlan(steering={HookPoint(0, RESID_POST): table}))
    with pytest.raises(ValueError, match=r"steering deltas are torch\.float64, the residual stream is torch\.float32"):
        logits(tiny_model, input_ids)
    hooks.clear()


def test_monitor_taps_refuse_bad_positions_and_top_k(sae: SAE) -> None:
    with pytest.raises(ValueError, match="positions must be a 1-D long tensor"):
        MonitorTap("a", sae, torch.tensor([[0]]), top_k=1)
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        MonitorTap("a", sae, torch.tensor([0]), top_k=0)


def test_plan_refuses_repeated_monitor_keys(sae: SAE) -> None:
    tap = MonitorTap("same", sae, torch.tensor([0]), top_k=1)
    with pytest.raises(ValueError, match="its own key"):
        StepPlan(monitors={HookPoint(2, RESID_POST): [tap], HookPoint(1, RESID_PRE): [tap]})


def test_hooks_past_the_last_layer_are_refused(hooks: BatchHooks) -> None:
    with pytest.raises(ValueError, match="past the model's 4 layers"):
        hooks.set_step(
            StepPlan(
                steering={
                    HookPoint(4, RESID_PRE): build_steering_table(packed_rows([1]), [torch.ones(128)], torch.float32)
                }
            )
        )


class TupleLayer(torch.nn.Module):
    """A decoder layer as transformers before 5 wrote them: hidden states by keyword in, a tuple out."""

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, None]:
        return hidden_states * 2, None


class TupleModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([TupleLayer()])

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layers[0](hidden_states=hidden_states)[0]


def test_keyword_inputs_and_tuple_outputs_are_steered() -> None:
    model = TupleModel()
    hooks = BatchHooks(
        ModelLayout(model.layers, LLAMA_LAYOUT, hidden_size=3, has_resid_mid=True, residual_multiplier=1)
    )
    table = build_steering_table(packed_rows([1, 2]), [torch.ones(3), None], torch.float32)
    hooks.set_step(StepPlan(steering={HookPoint(0, RESID_PRE): table, HookPoint(0, RESID_POST): table}))
    steered = model(torch.zeros(1, 3, 3))  # (0 + 1) * 2 + 1 on row 0's token, 0 on row 1's
    hooks.close()
    assert steered[0, :, 0].tolist() == [3.0, 0.0, 0.0]
