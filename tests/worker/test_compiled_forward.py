"""TORCH_COMPILE: steps run through the compiled graph, with the same logits as eager, and never with hooks left."""

from __future__ import annotations

import pytest
import torch

from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request, RequestStatus
from steering.hook_points import HookPoint
from worker.model_runner import ModelRunner  # which defines steerbatch::paged_attention


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
    compiled_endless_runner._hooks._install(HookPoint(1, "post"))  # as a steered step leaves them
    assert compiled_endless_runner._hooks.installed

    compiled_endless_runner.run(mixed_batch((30, 40)))

    assert not compiled_endless_runner._hooks.installed


def test_the_op_refuses_to_run_outside_a_compiled_step() -> None:
    tensor = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="outside current_step"):
        torch.ops.steerbatch.paged_attention(tensor, tensor, tensor, torch.zeros(1), 0, 1.0)
