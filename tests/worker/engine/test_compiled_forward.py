"""TORCH_COMPILE: steps run through the compiled graph, with the same logits as eager, and never with hooks left."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request, RequestStatus
from steering.hook_points import RESID_POST, HookPoint
from worker.engine.compiled_forward import compile_model
from worker.engine.model_runner import ModelRunner


class CountingCalls:
    def __init__(self, wrapped: torch.nn.Module) -> None:
        self.wrapped, self.num_calls = wrapped, 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.num_calls += 1
        return self.wrapped(*args, **kwargs)


def mixed_batch(block_ids: tuple[int, int]) -> Batch:
    """A 20-token prefill chunk beside a decode row whose first 9 tokens are already in its block."""
    prompt = [(7 * i) % 50 + 5 for i in range(20)]
    prefill = Request("prefill", prompt, max_tokens=4, block_table=[block_ids[0], block_ids[0] + 1])
    decode = Request("decode", prompt[:10], max_tokens=4, block_table=[block_ids[1]], num_computed_tokens=9)
    for request in (prefill, decode):
        request.status = RequestStatus.RUNNING
    return Batch([ScheduledChunk(prefill, 0, 20, is_sampling=True), ScheduledChunk(decode, 9, 1, is_sampling=True)])


def test_compiled_steps_match_eager_logits(
    compiled_endless_runner: ModelRunner, endless_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = CountingCalls(compiled_endless_runner._compiled)
    monkeypatch.setattr(compiled_endless_runner, "_compiled", counting)
    for runner in (compiled_endless_runner, endless_runner):  # the decode row's first 9 tokens, into its block
        runner.run(Batch([ScheduledChunk(mixed_batch((10, 20)).chunks[1].request, 0, 9, is_sampling=False)]))
    counting.num_calls = 0

    compiled = compiled_endless_runner.run(mixed_batch((10, 20))).logits
    eager = endless_runner.run(mixed_batch((10, 20))).logits

    assert counting.num_calls == 1
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    assert compiled.argmax(dim=-1).tolist() == eager.argmax(dim=-1).tolist()


def test_a_plain_step_removes_hooks_left_by_a_steered_one(compiled_endless_runner: ModelRunner) -> None:
    compiled_endless_runner._hooks._install(HookPoint(1, RESID_POST))  # as a steered step leaves them
    assert compiled_endless_runner._hooks.installed

    compiled_endless_runner.run(mixed_batch((30, 40)))

    assert not compiled_endless_runner._hooks.installed


def test_the_op_refuses_to_run_outside_a_compiled_step() -> None:
    tensor = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="outside current_step"):
        torch.ops.steerbatch.paged_attention(tensor, tensor, tensor, torch.zeros(1), 0, 1.0, 0, 0.0, None)


def test_after_the_warm_up_no_kind_of_step_compiles_again(
    compiled_endless_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert compiled_endless_runner._is_compiled_warm  # serving checks only the guards that tell graphs apart...
    monkeypatch.setattr(compiled_endless_runner, "_is_compiled_warm", False)  # ...so check them all here
    counters = torch._dynamo.utils.counters["stats"]
    graphs_before = counters["unique_graphs"]
    prompt = list(range(5, 25))
    steps = []
    for i, (start, num_tokens, is_sampling) in enumerate([(0, 12, False), (12, 8, True), (19, 1, True)]):
        request = Request(
            f"r{i}", prompt, max_tokens=2, block_table=[50 + 2 * i, 51 + 2 * i], num_computed_tokens=start
        )
        request.status = RequestStatus.RUNNING
        steps.append(ScheduledChunk(request, start, num_tokens, is_sampling))
    for batch in ([steps[0]], [steps[1]], [steps[2]], [steps[0], steps[2]], [steps[1], steps[2]], steps):
        compiled_endless_runner.run(Batch(batch))

    assert counters["unique_graphs"] == graphs_before


def test_a_second_architecture_in_one_process_is_refused(compiled_endless_runner: ModelRunner) -> None:
    config = copy.deepcopy(compiled_endless_runner.model.config)
    config.num_hidden_layers = 2  # the guards skip modules, so this model would run the 4-layer graph
    with pytest.raises(ValueError, match="another architecture"):
        compile_model(AutoModelForCausalLM.from_config(config))
    assert compile_model(compiled_endless_runner.model) is not None  # the same one again is fine
