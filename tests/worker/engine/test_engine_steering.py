"""Steering inside the continuous batch: each request gets exactly its own steering, checked against HF `generate`
with a hook on the same layer, and unsteered requests are untouched by steered ones in their batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from steering.registry import SAERegistry
from steering.sae_math import steering_direction
from tasks.config import Config
from tasks.messages.steering import SteeringFeature, SteeringSpec, SteeringVector
from tests.steering.sae_folders import TINY_SAE_ID
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, run, serve, submit_together
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest

pytestmark = pytest.mark.usefixtures("tiny_sae_root")
MAX_TOKENS = 10
LAYER = 2  # the tiny SAE hooks blocks.2.hook_resid_post


def chat_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])


def feature_spec(demo: dict, number: int, strength: float | None = None) -> SteeringSpec:
    feature = demo["features"][number]
    strength = feature["strength"] if strength is None else strength
    return SteeringSpec(TINY_SAE_ID, (SteeringFeature(feature["index"], strength),))


def steered_reference(reference: PreTrainedModel, delta: torch.Tensor, prompt: list[int], max_tokens: int) -> list[int]:
    """HF greedy `generate` with `delta` added to decoder layer LAYER's output at every position."""
    layer = reference.model.layers[LAYER]
    handle = layer.register_forward_hook(lambda module, args, output: output + delta)
    try:
        return hf_greedy(reference, frozenset(), prompt, max_tokens)
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def demo_directions(tiny_sae_root: Path, steering_demo: dict) -> list[torch.Tensor]:
    """Each constructed feature's steering delta [hidden] at its demo strength."""
    sae = SAERegistry(tiny_sae_root).get(TINY_SAE_ID)
    return [steering_direction(sae, [(f["index"], f["strength"])]) for f in steering_demo["features"]]


def test_a_steered_request_turns_toward_its_feature_token_as_hf_with_the_same_hook_does(
    endless_engine: ContinuousEngine,
    tokenizer: PreTrainedTokenizerBase,
    reference_model: PreTrainedModel,
    steering_demo: dict,
    demo_directions: list[torch.Tensor],
) -> None:
    prompt = chat_prompt(tokenizer, "tell me about dogs")
    feature = steering_demo["features"][0]
    plain = run(endless_engine, "plain", prompt, greedy(MAX_TOKENS))
    steered = run(endless_engine, "steered", prompt, greedy(MAX_TOKENS), feature_spec(steering_demo, 0))

    assert plain.token_ids[0] != feature["token_id"]
    assert steered.token_ids[0] == feature["token_id"]
    assert steered.token_ids == steered_reference(reference_model, demo_directions[0], prompt, MAX_TOKENS)
    assert steered.outputs[0].steering == feature_spec(steering_demo, 0)
    assert all(output.steering is None for output in steered.outputs[1:] + plain.outputs)


def test_steered_and_unsteered_requests_in_one_batch_each_equal_their_solo_runs(
    endless_engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase, steering_demo: dict
) -> None:
    prompts = [chat_prompt(tokenizer, "what is 3 plus 4?")] * 3 + [chat_prompt(tokenizer, "tell me a story")] * 3
    specs = [None, feature_spec(steering_demo, 1), feature_spec(steering_demo, 2)] * 2
    solo = [
        run(endless_engine, f"solo-{i}", prompt, greedy(MAX_TOKENS), spec).token_ids
        for i, (prompt, spec) in enumerate(zip(prompts, specs, strict=True))
    ]
    requests = [
        EngineRequest(f"together-{i}", prompt, greedy(MAX_TOKENS), steering=spec)
        for i, (prompt, spec) in enumerate(zip(prompts, specs, strict=True))
    ]
    together = submit_together(endless_engine, requests)

    assert endless_engine.stats.max_batch_size_seen >= 4
    assert [collector.token_ids for collector in together] == solo
    assert len({tuple(tokens) for tokens in solo[:3]}) == 3  # steering changed the shared prompt's output


def test_an_empty_feature_list_is_unsteered_and_echoed(
    endless_engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat_prompt(tokenizer, "tell me about cats")
    explicit = SteeringSpec(TINY_SAE_ID, ())
    plain = run(endless_engine, "none", prompt, greedy(MAX_TOKENS))
    empty = run(endless_engine, "empty", prompt, greedy(MAX_TOKENS), explicit)
    assert empty.token_ids == plain.token_ids
    assert empty.outputs[0].steering == explicit


def test_a_raw_vector_on_the_sae_layer_steers_like_the_feature_and_strengths_are_clamped(
    endless_engine: ContinuousEngine,
    tokenizer: PreTrainedTokenizerBase,
    steering_demo: dict,
    demo_directions: list[torch.Tensor],
) -> None:
    prompt = chat_prompt(tokenizer, "what is the capital of Peru?")
    vector = SteeringVector(LAYER, 1.0, values=tuple(demo_directions[0].tolist()))
    by_feature = run(endless_engine, "by-feature", prompt, greedy(MAX_TOKENS), feature_spec(steering_demo, 0))
    by_vector = run(endless_engine, "by-vector", prompt, greedy(MAX_TOKENS), SteeringSpec(vectors=(vector,)))
    huge = run(endless_engine, "huge", prompt, greedy(2), feature_spec(steering_demo, 0, strength=1e9))

    assert by_vector.token_ids == by_feature.token_ids
    assert by_vector.token_ids[0] == steering_demo["features"][0]["token_id"]
    assert huge.outputs[0].steering.features[0].strength == 1000.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SteeringSpec("tiny/none", (SteeringFeature(0, 1.0),)), "unknown sae_id"),
        (SteeringSpec("../saes", (SteeringFeature(0, 1.0),)), "'.', '..'"),
        (SteeringSpec(TINY_SAE_ID, (SteeringFeature(512, 1.0),)), "outside [0, 512)"),
        (SteeringSpec(vectors=(SteeringVector(LAYER, 1.0, values=(1.0, 2.0)),)), "the model needs"),
        (SteeringSpec(vectors=(SteeringVector(9, 1.0, values=(1.0,)),)), "layer 9 is outside"),
        (SteeringSpec(vectors=(SteeringVector(0, 1.0, path="../x.safetensors"),)), "inside the vector root"),
    ],
)
def test_bad_steering_fails_only_its_own_request(
    endless_engine: ContinuousEngine, spec: SteeringSpec, message: str
) -> None:
    failed = run(endless_engine, "bad", [5, 6, 7], greedy(3), spec)
    assert failed.outputs[-1].error is not None and message in failed.outputs[-1].error
    assert failed.token_ids == []
    assert len(run(endless_engine, "fine", [5, 6, 7], greedy(3)).token_ids) == 3


def test_the_prefix_cache_never_serves_kv_computed_under_other_steering(
    endless_engine: ContinuousEngine,
    reference_model: PreTrainedModel,
    steering_demo: dict,
    demo_directions: list[torch.Tensor],
) -> None:
    prompt = list(range(300, 364))  # four full KV blocks
    steering = feature_spec(steering_demo, 0)

    def hits() -> int:
        return endless_engine.stats.prefix_cache_hit_blocks

    plain = run(endless_engine, "plain", prompt, greedy(MAX_TOKENS)).token_ids
    before = hits()
    steered = run(endless_engine, "steered", prompt, greedy(MAX_TOKENS), steering).token_ids
    assert hits() == before  # the unsteered blocks were not taken
    assert steered == steered_reference(reference_model, demo_directions[0], prompt, MAX_TOKENS) != plain
    assert run(endless_engine, "steered-again", prompt, greedy(MAX_TOKENS), steering).token_ids == steered
    assert hits() > before  # the same steering does share its blocks
    assert run(endless_engine, "plain-again", prompt, greedy(MAX_TOKENS)).token_ids == plain


@pytest.mark.parametrize("method", ["ngram", "self", "draft"])
def test_only_the_steered_row_of_a_mixed_batch_stays_out_of_speculation(
    method: str,
    tiny_config: Config,
    tokenizer: PreTrainedTokenizerBase,
    steering_demo: dict,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the target as its own draft: every proposal is right, so an unsteered row always has proposals to report
    config = dataclasses.replace(tiny_config, speculative_method=method, speculative_draft_model=tiny_config.model)
    serving = serve(load_runner(config, stops_at_eos=False), config, caplog)
    engine = next(serving)
    prompt = chat_prompt(tokenizer, "one two three one two three one two three")
    solo_steered = run(engine, "solo-steered", prompt, greedy(16), feature_spec(steering_demo, 1)).token_ids
    requests = [
        EngineRequest("plain", prompt, greedy(16)),
        EngineRequest("steered", prompt, greedy(16), steering=feature_spec(steering_demo, 1)),
    ]
    plain, steered = submit_together(engine, requests)
    assert steered.token_ids == solo_steered
    assert steered.outputs[-1].num_proposed_tokens == 0
    assert plain.outputs[-1].num_proposed_tokens > 0
    next(serving, None)
