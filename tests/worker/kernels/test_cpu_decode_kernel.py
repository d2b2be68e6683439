"""The CPU decode kernel: the same attention as the gather path, built once per machine, and a clean fallback."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request
from tests.worker.kernels.attention_reference import VARIANTS, layer_variant, reference_attention
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.gather_attention import decode_attention, gather_blocks, gather_keys
from worker.engine.attention.kv_pool import KVPool, KVShape
from worker.engine.attention.paged_step import build_paged_step
from worker.engine.model_runner import ModelRunner
from worker.engine.sampling.sampler import torch_argmax
from worker.kernels.cpu_decode_kernel import CpuDecodeKernel, load_cpu_decode_kernel
from worker.kernels.layer_variant import LayerVariant

HAS_COMPILER = shutil.which("cc") is not None
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc) to build the kernel")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> CpuDecodeKernel:
    if not HAS_COMPILER:
        pytest.skip("no C compiler (cc) to build the kernel")
    built = load_cpu_decode_kernel(tmp_path_factory.mktemp("kernels"))
    assert built is not None
    return built


def gathered_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    """The reference: the engine's gather path over the same pool."""
    num_kv_heads, _, block_size, _ = k_cache.shape
    width = tables.shape[1]
    is_padding = torch.arange(width * block_size)[None, :] >= lens[:, None]
    bias = torch.zeros(is_padding.shape).masked_fill_(is_padding, float("-inf")).repeat(num_kv_heads, 1)[:, None]
    k, v = gather_blocks(k_cache, tables.flatten()), gather_blocks(v_cache, tables.flatten())
    return decode_attention(query, k, v, bias, LayerVariant(query.shape[-1] ** -0.5))


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [
        (4, 2, 32, 16),  # the tiny model
        (4, 4, 32, 16),  # no GQA
        (8, 2, 64, 16),  # the head dims whose sums stay in registers
        (8, 2, 128, 16),
        (6, 2, 32, 16),  # groups of 3: a pair of heads, then one, through the fixed sums
        (6, 2, 64, 16),
        (16, 2, 32, 16),  # groups of 8: the scores four heads at a time
        (6, 2, 24, 16),  # another head dim: the generic sums
        (8, 1, 16, 16),
        (4, 2, 80, 8),  # another block size: the generic scores
    ],
)
def test_kernel_equals_the_gather_path(
    kernel: CpuDecodeKernel, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    torch.manual_seed(num_heads * 100 + head_dim)
    num_blocks = 128
    k_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim)
    v_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim)
    lens = torch.tensor([1, block_size, block_size + 1, 100, 5, 63])  # one token, a whole block, one over, ragged
    width = int(-(-lens.max() // block_size))
    tables = torch.randperm(num_blocks)[: len(lens) * width].view(len(lens), width)  # scattered blocks
    for row, length in enumerate(lens.tolist()):  # past a row's own blocks, the table is padding
        tables[row, -(-length // block_size) :] = 0
    query = torch.randn(len(lens), num_heads, head_dim)

    keys_transposed = k_cache.transpose(2, 3).contiguous()  # as a pool with the kernel stores them
    variant = LayerVariant(head_dim**-0.5)
    attended = kernel.attention(query, keys_transposed, v_cache, tables, lens, int(lens.max()), variant)

    torch.testing.assert_close(attended, gathered_attention(query, k_cache, v_cache, tables, lens))


@pytest.mark.parametrize(("window", "softcap", "has_sinks"), VARIANTS)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(4, 2, 32, 16), (8, 2, 64, 16), (6, 2, 24, 16), (4, 2, 80, 8)],  # fixed and generic sums and scores
)
def test_kernel_applies_the_layer_variant(
    kernel: CpuDecodeKernel,
    window: int | None,
    softcap: float | None,
    has_sinks: bool,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
) -> None:
    torch.manual_seed(num_heads * 100 + head_dim)
    num_blocks = 64
    k_cache, v_cache = (torch.randn(num_kv_heads, num_blocks, block_size, head_dim) for _ in "kv")
    lens = [1, 20, 21, 22, block_size + 5, 70]  # within the window, at it, just past it, far past it
    width = -(-max(lens) // block_size)
    tables = torch.randperm(num_blocks)[: len(lens) * width].view(len(lens), width)
    query = torch.randn(len(lens), num_heads, head_dim)
    variant = layer_variant(head_dim**-0.5, num_heads, window, softcap, has_sinks)

    keys_transposed = k_cache.transpose(2, 3).contiguous()
    attended = kernel.attention(query, keys_transposed, v_cache, tables, torch.tensor(lens), max(lens), variant)

    for row, length in enumerate(lens):
        expected = reference_attention(query[row : row + 1], k_cache, v_cache, tables[row], length - 1, variant)
        torch.testing.assert_close(attended[row : row + 1], expected)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(4, 2, 32, 16), (16, 2, 32, 16), (6, 2, 64, 16), (8, 2, 128, 16), (6, 2, 24, 16), (4, 2, 80, 8)],
)
def test_decode_step_equals_the_pool_write_then_attention(
    kernel: CpuDecodeKernel, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    """The fused call stores each row's new K/V where the pool's write does and attends as `attention` does, reading
    queries, keys and values through the strides the model's projections leave them with."""
    torch.manual_seed(num_heads * 100 + head_dim + block_size)
    shape, num_blocks = KVShape(1, num_kv_heads, head_dim), 64
    pools = [KVPool(shape, num_blocks, block_size, torch.float32, torch.device("cpu"), True, kernel) for _ in "ab"]
    pools[0].cache.normal_()
    pools[1].cache.copy_(pools[0].cache)
    lens = torch.tensor([1, block_size, block_size + 1, 40, 5])  # each row's length, its new token included
    width = int(-(-lens.max() // block_size))
    tables = torch.randperm(num_blocks)[: len(lens) * width].view(len(lens), width)
    for row, length in enumerate(lens.tolist()):
        tables[row, -(-length // block_size) :] = 0
    slots = torch.tensor(
        [
            int(tables[row, (n - 1) // block_size]) * block_size + (n - 1) % block_size
            for row, n in enumerate(lens.tolist())
        ]
    )
    # [1, N, heads, D] transposed to [1, heads, N, D], as HF's attention modules hand them over
    query, key, value = (
        torch.randn(1, len(lens), heads, head_dim).transpose(1, 2) for heads in (num_heads, num_kv_heads, num_kv_heads)
    )
    variant, max_len = layer_variant(head_dim**-0.5, num_heads, 21, 0.8, True), int(lens.max())  # every variant

    pools[0].write(0, slots, key[0], value[0])
    expected = kernel.attention(
        query[0].transpose(0, 1).contiguous(), *pools[0].layer(0), tables, lens, max_len, variant
    )
    bound = kernel.bind_decode_step(pools[1].layers, slots, tables, lens, max_len)
    fused = bound(0, query, key, value, variant)

    assert torch.equal(pools[1].cache, pools[0].cache)
    assert torch.equal(fused, expected)


@pytest.mark.parametrize("shape", [(32, 2048), (1, 1), (3, 15), (4, 16), (5, 17), (7, 45), (2, 50_000)])
def test_kernel_argmax_equals_torchs(kernel: CpuDecodeKernel, shape: tuple[int, int]) -> None:
    generator = torch.Generator().manual_seed(shape[1])
    for _ in range(20):
        logits = torch.randn(shape, generator=generator)
        assert torch.equal(kernel.argmax(logits), logits.argmax(dim=-1))


@pytest.mark.parametrize("num_cols", [7, 16, 40, 45])
def test_kernel_argmax_picks_as_torch_among_ties_infinities_and_nans(kernel: CpuDecodeKernel, num_cols: int) -> None:
    generator = torch.Generator().manual_seed(num_cols)
    ties = torch.randint(0, 3, (64, num_cols), generator=generator).float()
    assert torch.equal(kernel.argmax(ties), ties.argmax(dim=-1))
    for _ in range(100):
        logits = torch.randn(6, num_cols, generator=generator)
        logits[torch.rand(6, num_cols, generator=generator) < 0.05] = float("nan")
        logits[torch.rand(6, num_cols, generator=generator) < 0.05] = float("inf")
        logits[torch.rand(6, num_cols, generator=generator) < 0.05] = float("-inf")
        assert torch.equal(kernel.argmax(logits), logits.argmax(dim=-1))


def test_kernel_refuses_tensors_it_would_misread(kernel: CpuDecodeKernel) -> None:
    k_cache, v_cache = torch.zeros(1, 4, 8, 16), torch.zeros(1, 4, 16, 8)
    tables, lens = torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long)
    with pytest.raises(ValueError, match="float32"):
        kernel.attention(
            torch.zeros(1, 2, 8, dtype=torch.float64), k_cache, v_cache, tables, lens, 1, LayerVariant(1.0)
        )
    with pytest.raises(ValueError, match="int64"):
        kernel.attention(torch.zeros(1, 2, 8), k_cache, v_cache, tables.int(), lens, 1, LayerVariant(1.0))
    with pytest.raises(ValueError, match="query heads per KV head"):
        kernel.attention(torch.zeros(1, 65, 8), k_cache, v_cache, tables, lens, 1, LayerVariant(1.0))
    with pytest.raises(ValueError, match="float32"):
        kernel.write_keys(k_cache, torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, 8, dtype=torch.float64))
    slots, keys = torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, 1, 8)
    with pytest.raises(ValueError, match="int64"):
        kernel.bind_decode_step([(k_cache, v_cache)], slots.int(), tables, lens, 1)
    bound = kernel.bind_decode_step([(k_cache, v_cache)], slots, tables, lens, 1)
    with pytest.raises(ValueError, match="D contiguous"):
        bound(0, torch.zeros(1, 1, 8, 2).transpose(2, 3), keys, keys, LayerVariant(1.0))
    with pytest.raises(ValueError, match="another shape"):
        bound(0, torch.zeros(1, 2, 2, 8), keys, keys, LayerVariant(1.0))
    with pytest.raises(ValueError, match="another shape"):  # values of another head dim than the keys
        bound(0, torch.zeros(1, 2, 1, 8), keys, torch.zeros(1, 1, 1, 4), LayerVariant(1.0))
    with pytest.raises(ValueError, match="query heads per KV head"):
        bound(0, torch.zeros(1, 65, 1, 8), keys, keys, LayerVariant(1.0))
    two_kv_heads = [(torch.zeros(2, 4, 8, 16), torch.zeros(2, 4, 16, 8))]
    bound_two_heads = kernel.bind_decode_step(two_kv_heads, slots, tables, lens, 1)
    with pytest.raises(ValueError, match="query heads per KV head"):  # 3 query heads over 2 KV heads
        bound_two_heads(0, torch.zeros(1, 3, 1, 8), torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), LayerVariant(1.0))


def test_a_step_the_kernel_would_read_or_write_out_of_bounds_is_refused(kernel: CpuDecodeKernel) -> None:
    pool = KVPool(KVShape(1, 1, 8), 4, 16, torch.float32, torch.device("cpu"), True, kernel)

    def decode_step(block_table: list[int]) -> Batch:
        request = Request("r", list(range(20)), max_tokens=2, block_table=block_table, num_computed_tokens=19)
        return Batch([ScheduledChunk(request, 19, 1, is_sampling=True)])

    with pytest.raises(IndexError):  # 20 tokens in one block of 16
        build_paged_step(decode_step([0]), pool, torch.device("cpu"), AttentionBackend.CPU_KERNEL)
    with pytest.raises(IndexError, match="outside the pool"):  # block 7 of a pool of 4
        build_paged_step(decode_step([0, 7]), pool, torch.device("cpu"), AttentionBackend.CPU_KERNEL)
    with pytest.raises(IndexError, match="block table lists a block outside"):  # an earlier block past the pool
        build_paged_step(decode_step([9, 3]), pool, torch.device("cpu"), AttentionBackend.CPU_KERNEL)
    assert (
        build_paged_step(decode_step([0, 3]), pool, torch.device("cpu"), AttentionBackend.CPU_KERNEL).decode_table
        is not None
    )


@needs_compiler
def test_a_built_kernel_is_reused(tmp_path: Path) -> None:
    assert load_cpu_decode_kernel(tmp_path) is not None
    (library,) = tmp_path.glob("paged_decode-*.so")
    built_at = library.stat().st_mtime_ns
    assert load_cpu_decode_kernel(tmp_path) is not None
    assert [path.name for path in tmp_path.iterdir()] == [library.name]  # no scratch left behind
    assert library.stat().st_mtime_ns == built_at


def test_no_compiler_falls_back_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    with caplog.at_level(logging.WARNING, logger="worker.kernels.cpu_decode_kernel"):
        assert load_cpu_decode_kernel(tmp_path) is None
    assert "gathers blocks instead" in caplog.text
    assert list(tmp_path.glob("*.so")) == []


@needs_compiler
def test_the_default_cpu_runner_decodes_with_the_kernel(runner: ModelRunner, gather_endless_runner: ModelRunner):
    assert runner.kv_pool.decode_kernel is not None
    assert runner.argmax == runner.kv_pool.decode_kernel.argmax  # greedy rows too
    assert gather_endless_runner.kv_pool.decode_kernel is None
    assert gather_endless_runner.argmax is torch_argmax


def test_a_pool_with_the_kernel_stores_keys_transposed_within_blocks(kernel: CpuDecodeKernel) -> None:
    pool = KVPool(KVShape(1, 2, 8), 4, 16, torch.float32, torch.device("cpu"), True, kernel)
    slots = torch.tensor([0, 17, 63])
    key, value = torch.randn(3, 2, 8).transpose(0, 1), torch.randn(2, 3, 8)  # keys come strided, as from HF

    pool.write(0, slots, key, value)

    keys, values = pool.layer(0)
    assert keys.shape == (2, 4, 8, 16)
    for token, slot in enumerate(slots.tolist()):
        block, offset = divmod(slot, 16)
        assert torch.equal(keys[:, block, :, offset], key[:, token])
        assert torch.equal(values[:, block, offset], value[:, token])
    gathered = gather_keys(keys, torch.tensor([1]), is_transposed=True)  # [Hkv, 16, D], as prefill reads them
    assert torch.equal(gathered[:, 1], key[:, 1])
