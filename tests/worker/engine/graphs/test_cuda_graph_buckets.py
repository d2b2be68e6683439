"""The bookkeeping of decode graphs, on CPU: buckets, which steps qualify, the static buffers' rows and padding, and
a padded static-buffer step through the Triton kernels (under the interpreter) against the unpadded eager step over
the same pool: the same attention for the real rows, the same K/V in every real block, only the scratch block
touched by the padding rows. The capture itself: tests/worker/engine/test_cuda_graphs_gpu.py."""

from __future__ import annotations

import pytest
import torch

from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request
from steering.hook_points import RESID_POST, RESID_PRE, HookPoint
from steering.step_plan import MonitorTap, SteeringTable, StepPlan
from tests.worker.family_configs import family_config
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.kv_pool import KVPool, KVShape
from worker.engine.attention.paged_attention import paged_attention_at
from worker.engine.attention.paged_step import build_paged_step
from worker.engine.graphs.decode_buffers import (
    CONTEXT_LEN,
    POSITION,
    SLOT,
    TOKEN,
    DecodeBuffers,
    bucket_for,
    decode_buckets,
    is_graph_step,
)
from worker.engine.graphs.graph_hooks import GraphHookBuffers, HookSet
from worker.engine.graphs.graph_mode import GraphMode, graph_mode_for_model, has_routed_experts
from worker.kernels.layer_variant import LayerVariant

BLOCK_SIZE, NUM_BLOCKS, MAX_ROWS, MAX_BLOCKS_PER_ROW = 16, 24, 8, 4
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 32
CPU = torch.device("cpu")


def decode_chunk(name: str, num_tokens: int, table: list[int]) -> ScheduledChunk:
    """Request `name` holding `num_tokens` tokens, decoding its last one (its K/V computed this step)."""
    request = Request(name, list(range(7, 7 + num_tokens)), max_tokens=4, block_table=table)
    return ScheduledChunk(request, num_tokens - 1, 1, is_sampling=True)


def scratched_pool() -> KVPool:
    pool = KVPool(
        KVShape(1, NUM_KV_HEADS, HEAD_DIM), NUM_BLOCKS, BLOCK_SIZE, torch.float32, CPU, has_scratch_block=True
    )
    pool.cache.normal_()
    return pool


def test_buckets_are_powers_of_two_up_to_the_batch_limit() -> None:
    assert decode_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert decode_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert decode_buckets(1) == [1]
    buckets = decode_buckets(48)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 5, 16, 17, 33, 48)] == [1, 2, 4, 8, 16, 32, 48, 48]
    assert bucket_for(49, buckets) is None


def test_only_steps_of_sampling_decode_rows_run_as_graphs() -> None:
    decode = decode_chunk("a", 20, [3, 4])
    prompt = ScheduledChunk(Request("b", [1, 2, 3], max_tokens=2, block_table=[5]), 0, 3, is_sampling=True)
    request = Request("c", [1, 2, 3], max_tokens=2, block_table=[6], spec_token_ids=[9, 9])
    verify = ScheduledChunk(request, 2, 3, is_sampling=True, num_spec_tokens=2)
    one_prompt_token = ScheduledChunk(Request("d", [1, 2, 3], max_tokens=2, block_table=[7]), 1, 1, is_sampling=False)
    assert is_graph_step([decode, decode_chunk("e", 3, [8])])
    for other in (prompt, verify, one_prompt_token):
        assert not is_graph_step([decode, other])
    assert not is_graph_step([])


def test_rows_are_copied_in_and_padded_onto_the_scratch_block() -> None:
    pool = scratched_pool()
    buffers = DecodeBuffers(pool, MAX_ROWS, MAX_BLOCKS_PER_ROW, CPU)
    chunks = [decode_chunk("a", 20, [3, 9]), decode_chunk("b", 5, [11])]
    buffers.fill(chunks, 4)

    meta = buffers.meta[:, :4].tolist()
    scratch_slot = NUM_BLOCKS * BLOCK_SIZE
    assert meta[TOKEN] == [7 + 19, 7 + 4, 0, 0]
    assert meta[POSITION] == [19, 4, 0, 0]
    assert meta[SLOT] == [9 * BLOCK_SIZE + 3, 11 * BLOCK_SIZE + 4, scratch_slot, scratch_slot]
    assert meta[CONTEXT_LEN] == [20, 5, 1, 1]
    assert buffers.block_tables[:4, :2].tolist() == [[3, 9], [11, 0], [NUM_BLOCKS] * 2, [NUM_BLOCKS] * 2]
    assert buffers.fits(chunks)
    assert not buffers.fits([decode_chunk("long", MAX_BLOCKS_PER_ROW * BLOCK_SIZE + 1, [1] * 5)])
    with pytest.raises(IndexError, match="outside the pool"):
        buffers.fill([decode_chunk("c", 20, [3, NUM_BLOCKS])], 1)


def test_a_padded_static_step_attends_as_the_unpadded_eager_step_and_writes_only_the_scratch_block() -> None:
    torch.manual_seed(0)
    static_pool, eager_pool = scratched_pool(), scratched_pool()
    eager_pool.cache.copy_(static_pool.cache)
    chunks = [decode_chunk("a", 20, [3, 9]), decode_chunk("b", 5, [11]), decode_chunk("c", 33, [0, 5, 17])]
    num_rows, bucket = len(chunks), 4
    query = torch.randn(1, NUM_HEADS, bucket, HEAD_DIM)  # [1, H, N, D]; the padding row's token last
    key, value = torch.randn(1, NUM_KV_HEADS, bucket, HEAD_DIM), torch.randn(1, NUM_KV_HEADS, bucket, HEAD_DIM)

    buffers = DecodeBuffers(static_pool, MAX_ROWS, MAX_BLOCKS_PER_ROW, CPU)
    buffers.fill(chunks, bucket)
    static_step = buffers.step(bucket, num_splits=2)
    static = paged_attention_at(0, query, key, value, LayerVariant(HEAD_DIM**-0.5), static_step, static_pool)
    eager_step = build_paged_step(Batch(chunks), eager_pool, CPU, AttentionBackend.TRITON)
    real = slice(0, num_rows)
    eager = paged_attention_at(
        0, query[:, :, real], key[:, :, real], value[:, :, real], LayerVariant(HEAD_DIM**-0.5), eager_step, eager_pool
    )

    torch.testing.assert_close(static[real], eager, atol=1e-5, rtol=1e-5)
    real_blocks = slice(0, NUM_BLOCKS)
    assert torch.equal(static_pool.cache[:, :, :, real_blocks], eager_pool.cache[:, :, :, real_blocks])
    scratch = static_pool.cache[0, :, :, NUM_BLOCKS, 0]  # [2, Hkv, D]: K and V of the scratch block's first slot
    torch.testing.assert_close(scratch, torch.stack([key[0, :, -1], value[0, :, -1]]))


def test_hook_buffers_hold_each_rows_delta_and_zeros_elsewhere_and_a_residual_buffer_per_read_point() -> None:
    hidden, point, other = 6, HookPoint(1, RESID_POST), HookPoint(0, RESID_PRE)
    buffers = GraphHookBuffers(lambda _: hidden, MAX_ROWS, torch.float32, CPU)
    deltas = torch.randn(3, hidden)
    deltas[1] = 0  # row 1 unsteered
    steering = {point: SteeringTable(torch.arange(3), deltas)}
    tap = MonitorTap("r0", sae=None, positions=torch.tensor([2]), top_k=1)  # type: ignore[arg-type]
    plan = StepPlan(steering=steering, monitors={other: [tap]})
    assert HookSet.of(plan) == HookSet(frozenset({point}), frozenset({other}))
    assert not buffers.hooks.covers(HookSet.of(plan))

    buffers.extend(HookSet.of(plan))
    buffers.load(plan, 3)
    capture = buffers.capture_plan(4)
    assert buffers.hooks.covers(HookSet.of(plan))
    assert torch.equal(capture.steering[point].deltas[:3], deltas)
    assert torch.equal(capture.steering[point].deltas[3], torch.zeros(hidden))  # the padding row
    assert list(capture.captures) == [other] and capture.captures[other].shape == (4, hidden)

    buffers.load(None, 2)  # a step that steers nowhere zeroes what the last one left
    assert not capture.steering[point].deltas.any()


@pytest.mark.parametrize(
    ("family", "has_experts"),
    [("mixtral", True), ("qwen3_moe", True), ("gpt_oss", True), ("llama", False), ("gemma2", False)],
)
def test_models_with_routed_experts_decode_eagerly_on_cuda(family: str, has_experts: bool) -> None:
    config = family_config(family)
    assert has_routed_experts(config) is has_experts
    assert graph_mode_for_model(GraphMode.CAPTURE, config) is (None if has_experts else GraphMode.CAPTURE)
    assert graph_mode_for_model(GraphMode.EAGER_REPLAY, config) is GraphMode.EAGER_REPLAY
