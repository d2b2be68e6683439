"""A step through the Triton kernels (under the interpreter on CPU) against the SDPA path over the same pool: decode
rows, a first prompt chunk, a later chunk and a verify-sized chunk packed together."""

from __future__ import annotations

import pytest
import torch

from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.kv_pool import KVPool, KVShape
from worker.engine.attention.paged_attention import paged_attention_at
from worker.engine.attention.paged_step import build_paged_step
from worker.kernels.layer_variant import LayerVariant

BLOCK_SIZE, NUM_BLOCKS = 16, 40
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 32
CPU = torch.device("cpu")


def mixed_batch() -> Batch:
    """(tokens already computed, tokens this step) per request, each over scattered blocks."""
    spans = [(20, 1), (0, 20), (33, 1), (19, 13), (30, 4), (1, 1)]
    blocks = torch.randperm(NUM_BLOCKS).tolist()
    chunks = []
    for index, (start, num_tokens) in enumerate(spans):
        end = start + num_tokens
        num_blocks = -(-end // BLOCK_SIZE)
        table, blocks = blocks[:num_blocks], blocks[num_blocks:]
        request = Request(f"r{index}", list(range(5, 5 + end)), max_tokens=4, block_table=table)
        chunks.append(ScheduledChunk(request, start, num_tokens, is_sampling=True))
    return Batch(chunks)


def test_a_mixed_step_through_the_kernels_equals_the_sdpa_path() -> None:
    torch.manual_seed(0)
    shape = KVShape(1, NUM_KV_HEADS, HEAD_DIM)
    pools = {backend: KVPool(shape, NUM_BLOCKS, BLOCK_SIZE, torch.float32, CPU) for backend in ("sdpa", "triton")}
    pools["sdpa"].cache.normal_()
    pools["triton"].cache.copy_(pools["sdpa"].cache)
    batch = mixed_batch()
    num_tokens = batch.num_tokens
    # [1, heads, N, D] transposed from [1, N, heads, D], as HF's attention modules hand them over
    query, key, value = (
        torch.randn(1, num_tokens, heads, HEAD_DIM).transpose(1, 2) for heads in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS)
    )
    outputs = {}
    for name, backend in (("sdpa", AttentionBackend.SDPA), ("triton", AttentionBackend.TRITON)):
        step = build_paged_step(batch, pools[name], CPU, backend)
        assert (step.triton is not None) == (name == "triton")
        outputs[name] = paged_attention_at(0, query, key, value, LayerVariant(HEAD_DIM**-0.5), step, pools[name])

    assert torch.equal(pools["triton"].cache, pools["sdpa"].cache)  # the same K/V written at the same slots
    torch.testing.assert_close(outputs["triton"], outputs["sdpa"], atol=1e-5, rtol=1e-5)


def test_a_block_table_past_the_pool_is_refused_before_any_kernel_reads_it() -> None:
    pool = KVPool(KVShape(1, 1, 16), 4, BLOCK_SIZE, torch.float32, CPU)
    request = Request("r", list(range(20)), max_tokens=2, block_table=[9, 3], num_computed_tokens=19)
    batch = Batch([ScheduledChunk(request, 19, 1, is_sampling=True)])
    with pytest.raises(IndexError, match="block table lists a block outside"):
        build_paged_step(batch, pool, CPU, AttentionBackend.TRITON)
