"""Model-based speculative decoding (a draft model, and the target's own first layers): greedy output token-identical
to no speculation, alone, beside rows that do not speculate, and through preemption; and the length policy."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from scheduler.batch import ScheduledChunk
from scheduler.request import Request
from tasks.config import Config
from tests.worker.engine.speculation.test_speculation import assert_greedy_matches_hf_alone_and_mixed, grounded_prompt
from tests.worker.engine.test_engine_batching import random_prompts, submit_staggered
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, run, serve
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.engine.speculation.draft_models import loaded_draft_model, truncated_model
from worker.engine.speculation.draft_policy import (
    PROBE_INTERVAL,
    DraftPolicy,
    StepCost,
    StepTimer,
    most_rewarding_length,
    own_limits,
)
from worker.engine.speculation.draft_proposer import DraftProposer


@pytest.fixture(scope="module")
def random_draft_dir(tmp_path_factory: pytest.TempPathFactory, reference_model: PreTrainedModel) -> Path:
    """A 1-layer model with the target's vocabulary and random weights: it proposes, and is mostly rejected."""
    target = reference_model.config
    config = LlamaConfig(
        vocab_size=target.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=target.max_position_embeddings,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("random-draft")
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def draft_configs(tiny_config: Config, random_draft_dir: Path) -> dict[str, Config]:
    return {
        "self": dataclasses.replace(tiny_config, speculative_method="self"),
        "random-draft": dataclasses.replace(
            tiny_config, speculative_method="draft", speculative_draft_model=str(random_draft_dir)
        ),
        # the target as its own draft: every proposal is accepted
        "target-as-draft": dataclasses.replace(
            tiny_config, speculative_method="draft", speculative_draft_model=tiny_config.model
        ),
    }


@pytest.mark.parametrize("name", ["self", "random-draft", "target-as-draft"])
def test_greedy_output_is_identical_with_a_model_proposer(
    name: str,
    endless_runner: ModelRunner,
    tiny_config: Config,
    random_draft_dir: Path,
    reference_model: PreTrainedModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = dataclasses.replace(draft_configs(tiny_config, random_draft_dir)[name], spec_max_batch_size=8)
    runner = endless_runner if name == "self" else load_runner(config, stops_at_eos=False)  # loads the draft
    serving = serve(runner, config, caplog)
    engine = next(serving)
    prompts = [grounded_prompt(i) for i in range(1, 4)] + random_prompts(2, seed=5, lengths=(3, 40))
    assert_greedy_matches_hf_alone_and_mixed(engine, reference_model, prompts)
    stats = engine.stats
    assert stats.num_proposed_tokens > 0
    if name == "target-as-draft":
        assert stats.num_accepted_tokens == stats.num_proposed_tokens
    next(serving, None)


def test_a_draft_model_survives_preemption(
    endless_runner: ModelRunner,
    tiny_config: Config,
    reference_model: PreTrainedModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Preempted requests lose their blocks, and with them their draft K/V: the draft recomputes, output is exact."""
    config = dataclasses.replace(
        tiny_config,
        kv_cache_tokens=12 * 16,
        speculative_method="draft",
        speculative_draft_model=tiny_config.model,
        spec_max_batch_size=8,
    )
    runner = ModelRunner(config)
    runner.eos_token_ids = endless_runner.eos_token_ids
    serving = serve(runner, config, caplog)
    engine = next(serving)
    prompts = random_prompts(6, seed=2, lengths=(20, 40))
    requests = [EngineRequest(f"preempted-{i}", prompt, greedy(24)) for i, prompt in enumerate(prompts)]
    collectors = submit_staggered(engine, requests, max_gap_s=0.0)
    for prompt, collector in zip(prompts, collectors, strict=True):
        assert collector.token_ids == hf_greedy(reference_model, frozenset(), prompt, 24)
    stats = engine.stats
    assert stats.num_preemptions > 0 and stats.num_proposed_tokens > 0
    assert stats.num_accepted_tokens == stats.num_proposed_tokens
    next(serving, None)


def test_a_request_asking_for_an_absent_proposer_is_refused(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    serving = serve(endless_runner, tiny_config, caplog)  # no draft model
    engine = next(serving)
    refused = run(engine, "draft", [5, 6, 7], dataclasses.replace(greedy(4), speculative_method="draft")).outputs[-1]
    assert refused.is_request_error and "not available" in refused.error
    next(serving, None)


def test_the_truncated_model_is_the_targets_first_layers(reference_model: PreTrainedModel) -> None:
    truncated = truncated_model(reference_model, 2)
    assert len(truncated.model.layers) == 2 and len(reference_model.model.layers) == 4
    assert truncated.lm_head is reference_model.lm_head and truncated.model.layers[1] is reference_model.model.layers[1]
    input_ids = torch.tensor([[5, 6, 7, 8]])
    hidden = reference_model(input_ids, output_hidden_states=True).hidden_states[2]  # after 2 layers
    expected = reference_model.lm_head(reference_model.model.norm(hidden))
    torch.testing.assert_close(truncated(input_ids).logits, expected)


# a pass costs `pass_s` of a plain step (1.0); each verified proposal `verify_token_s`
@pytest.mark.parametrize(
    ("rates", "limits", "num_rows", "pass_s", "expected"),
    [
        ([1.0], [4], 1, 0.0, 4),  # free and always right: propose all
        ([0.9], [4], 1, 0.1, 4),
        ([0.6], [4], 1, 0.5, 1),  # one: 1.6 tokens for 1.5 steps; two: 1.96 for 2.0
        ([0.5], [4], 1, 0.5, 0),  # one token's 1.5 for 1.5 only ties with none
        ([0.8], [4], 1, 0.3, 3),
        ([0.9], [0], 1, 0.1, 0),
        ([0.6], [4], 4, 0.5, 0),  # the same row beside three that wait for the pass: it no longer pays
        ([0.6] * 4, [4] * 4, 4, 0.5, 1),  # four rows that all share the pass pay as one alone does
        ([0.9, 0.9], [1, 4], 2, 0.1, 4),  # a row's own limit caps only its own proposals
    ],
)
def test_the_proposal_length_maximizes_tokens_per_second(
    rates: list[float], limits: list[int], num_rows: int, pass_s: float, expected: int
) -> None:
    cost = StepCost(plain_s=1.0, pass_s=pass_s, verify_token_s=0.0)
    assert most_rewarding_length(rates, limits, num_rows, cost) == expected


def test_a_row_whose_proposals_do_not_pay_for_their_verification_proposes_none() -> None:
    cost = StepCost(plain_s=1.0, pass_s=0.1, verify_token_s=0.05)
    assert DraftPolicy().lengths([0.95, 0.1, 0.8], [4, 4, 2], 3, cost) == [4, 0, 2]


def test_verified_tokens_add_to_the_cost() -> None:
    free = StepCost(plain_s=1.0, pass_s=0.0, verify_token_s=0.0)
    costly = StepCost(plain_s=1.0, pass_s=0.0, verify_token_s=0.5)
    assert most_rewarding_length([0.5], [4], 1, free) == 4
    assert most_rewarding_length([0.5], [4], 1, costly) == 0


def test_a_proposer_that_does_not_pay_probes_now_and_then() -> None:
    policy = DraftPolicy()
    costly = StepCost(plain_s=1.0, pass_s=2.0, verify_token_s=0.0)
    lengths = [policy.lengths([0.3], [4], 1, costly)[0] for _ in range(7 * PROBE_INTERVAL)]
    probes = [step for step, length in enumerate(lengths) if length]
    assert probes == [PROBE_INTERVAL - 1, 3 * PROBE_INTERVAL - 1, 7 * PROBE_INTERVAL - 1]  # ever less often
    assert set(lengths) == {0, 1}
    policy.record(4, 1)
    assert policy.prior_rate == pytest.approx(0.7 + 0.3 * 0.25)
    assert policy.aged(0.0) == pytest.approx(0.1 * policy.prior_rate)  # a bad streak fades toward the prior


def test_a_proposer_waits_for_a_timed_plain_step_and_then_retimes_one_now_and_then() -> None:
    untimed, cheap = StepCost(None, 0.1, 0.0), StepCost(1.0, 0.1, 0.0)
    policy = DraftPolicy()
    assert policy.lengths([1.0], [4], 1, untimed)[0] == 0
    lengths = [policy.lengths([1.0], [4], 1, cheap)[0] for _ in range(2 * (PROBE_INTERVAL + 1))]
    assert lengths.count(0) == 2 and lengths[PROBE_INTERVAL] == 0 and set(lengths) == {0, 4}
    starved = DraftPolicy()  # other proposals keep every step from being plain: it goes ahead untimed
    assert [starved.lengths([1.0], [4], 1, untimed)[0] for _ in range(PROBE_INTERVAL + 1)][-1] == 4


def test_a_rows_own_share_of_a_large_batch_still_proposes() -> None:
    """The 5 % margin is the step's: one row of 32 cannot lift the step's tokens by 5 %, and must not have to."""
    cost = StepCost(plain_s=1.0, pass_s=0.0, verify_token_s=0.0)
    assert own_limits([0.6], [4], 32, cost) == [4]


def test_the_step_timer_keeps_plain_steps_apart_by_batch_size() -> None:
    timer = StepTimer()
    timer.record(2.0, 8, 0, is_decode_only=True)
    timer.record(1.0, 2, 0, is_decode_only=True)
    timer.record(5.0, 2, 0, is_decode_only=False)  # a prefill step says nothing about proposals
    timer.record(1.5, 2, 5, is_decode_only=True)
    assert timer.plain_s(8) == 2.0 and timer.plain_s(2) == 1.0 and timer.plain_s(4) is None
    assert timer.verify_token_s == pytest.approx(0.1)


@pytest.fixture(scope="module")
def random_draft_runner(tiny_config: Config, random_draft_dir: Path) -> ModelRunner:
    return ModelRunner(dataclasses.replace(tiny_config, speculative_draft_model=str(random_draft_dir)))


def draft_with_own_pool(runner: ModelRunner, max_catch_up_tokens: int) -> DraftProposer:
    return DraftProposer(loaded_draft_model(runner), max_catch_up_tokens)


def decoding_request(runner: ModelRunner, request_id: str, tokens: list[int], num_spec_tokens: int) -> ScheduledChunk:
    """A request ready to decode with `num_spec_tokens` placeholders, its blocks taken from the top of the pool."""
    request = Request(request_id, tokens, max_tokens=50)
    request.num_computed_tokens = len(tokens) - 1
    num_blocks = -(-(len(tokens) + num_spec_tokens) // runner.kv_pool.block_size)
    request.block_table = list(range(runner.kv_pool.num_blocks - num_blocks, runner.kv_pool.num_blocks))
    request.spec_token_ids = [0] * num_spec_tokens
    return ScheduledChunk.of(request, 1 + num_spec_tokens)


def test_a_draft_never_trusts_the_kv_of_its_rejected_proposals(random_draft_runner: ModelRunner) -> None:
    """Propose 4, have 1 accepted, decode a plain step, propose again: the proposal equals a fresh draft's."""
    proposer = draft_with_own_pool(random_draft_runner, 512)
    prompt = list(range(100, 140))
    chunk = decoding_request(random_draft_runner, "r", prompt, 4)
    proposer.fill([chunk])
    request = chunk.request
    accepted = request.spec_token_ids[0]
    proposer.rewind("r", 4, 1)
    request.output_token_ids = [accepted, 7]  # the one accepted proposal, then the model's own token
    request.num_computed_tokens = len(prompt) + 1
    request.spec_token_ids = []
    request.output_token_ids.append(9)  # a plain step: the target computed token 7, sampled 9
    request.num_computed_tokens += 1
    request.spec_token_ids = [0, 0]
    again = proposer.fill([ScheduledChunk.of(request, 3)])
    fresh = draft_with_own_pool(random_draft_runner, 512)
    twin = decoding_request(random_draft_runner, "twin", request.prompt_token_ids + request.output_token_ids, 2)
    fresh.fill([twin])
    assert again == [] and request.spec_token_ids == twin.request.spec_token_ids


def test_a_long_catch_up_is_cut_into_chunks_and_the_row_waits_for_it(random_draft_runner: ModelRunner) -> None:
    proposer = draft_with_own_pool(random_draft_runner, 16)
    chunk = decoding_request(random_draft_runner, "long", list(range(100, 140)), 2)
    assert proposer.fill([chunk]) == [chunk] and chunk.request.spec_token_ids == [0, 0]  # 16 of 39 caught up
    assert proposer.fill([chunk]) == [chunk]  # 32 of 39
    assert proposer.fill([chunk]) == [] and chunk.request.spec_token_ids != [0, 0]
