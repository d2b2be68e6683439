"""A quantized KV pool (KV_CACHE_DTYPE int8 and fp8_e4m3) read and written by every attention backend: the C decode
kernel, the gathering SDPA path and the Triton kernels (under Triton's interpreter on CPU) each attend over the codes
as over the pool's dequantized values, and the C kernel's own stores give the bytes torch's quantization gives.

Tolerance 1e-4 (absolute and relative): the kernels and the reference see the same dequantized float32 values, of
magnitudes up to about 30, so only summation order differs (measured at most 1.6e-5)."""

from __future__ import annotations

import pytest
import torch

from tests.worker.kernels.attention_reference import VARIANTS, layer_variant, reference_attention
from worker.engine.attention.gather_attention import decode_attention, gather_blocks
from worker.engine.attention.kv_pool import KVPool, KVShape
from worker.kernels import triton_decode
from worker.kernels.cpu_decode_kernel import CpuDecodeKernel, load_cpu_decode_kernel
from worker.kernels.kv_quant import KVCacheDtype, dequantize, fp8_e4m3_table, quantize_fp8, quantize_int8
from worker.kernels.layer_variant import LayerVariant
from worker.kernels.triton_decode import paged_decode
from worker.kernels.triton_prefill import paged_prefill

TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}
CODED = [KVCacheDtype.INT8, KVCacheDtype.FP8_E4M3]
NUM_BLOCKS = 32  # every row's blocks distinct: 6 rows of 5
BLOCK_SIZE = 16
LENS = [1, 15, 16, 17, 35, 70]  # across block boundaries
needs_interpreter = pytest.mark.skipif(not triton_decode.IS_INTERPRETED, reason="runs Triton under its interpreter")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> CpuDecodeKernel:
    built = load_cpu_decode_kernel(tmp_path_factory.mktemp("kernels"))
    if built is None:
        pytest.skip("no C compiler to build the kernel")
    return built


def filled_pool(
    kv_dtype: KVCacheDtype, num_kv_heads: int, head_dim: int, kernel: CpuDecodeKernel | None
) -> tuple[KVPool, torch.Tensor]:
    """A one-layer pool whose rows (LENS tokens each, in scattered blocks) were written through KVPool.write, and
    their block tables [R, W] int64. Values are spread over magnitudes as real K/V are (some heads much larger)."""
    shape = KVShape(1, num_kv_heads, head_dim)
    pool = KVPool(shape, NUM_BLOCKS, BLOCK_SIZE, torch.float32, torch.device("cpu"), True, kernel, kv_dtype=kv_dtype)
    width = -(-max(LENS) // BLOCK_SIZE)
    tables = torch.randperm(NUM_BLOCKS)[: len(LENS) * width].view(len(LENS), width)
    for row, length in enumerate(LENS):
        positions = torch.arange(length)
        slots = tables[row, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
        magnitudes = torch.logspace(-1, 1, num_kv_heads)[:, None, None]
        key, value = (torch.randn(num_kv_heads, length, head_dim) * magnitudes for _ in "kv")
        pool.write(0, slots, key, value)
    return pool, tables


def dequantized_layer(pool: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's layer 0 as float32 K and V [Hkv, blocks, block_size, D], keys untransposed."""
    keys, values = pool.layer(0)
    if pool.keys_transposed:
        keys = keys.transpose(2, 3)
    all_blocks = torch.arange(keys.shape[1])
    flat_keys, flat_values = gather_blocks(keys.contiguous(), all_blocks), gather_blocks(values, all_blocks)
    k, v = pool.dequantized(0, flat_keys, flat_values, all_blocks)
    return k.view(keys.shape), v.view(values.shape)


def expected_decode(
    pool: KVPool, queries: torch.Tensor, tables: torch.Tensor, variant: LayerVariant
) -> list[torch.Tensor]:
    keys, values = dequantized_layer(pool)
    return [
        reference_attention(queries[row : row + 1], keys, values, tables[row], length - 1, variant)
        for row, length in enumerate(LENS)
    ]


def test_int8_codes_keep_each_token_within_half_a_step_of_its_scale() -> None:
    values = torch.randn(3, 40, 64) * torch.logspace(-3, 2, 40)[None, :, None]
    codes, scales = quantize_int8(values)
    assert codes.dtype == torch.int8 and scales.shape == (3, 40)
    error = (dequantize(codes, scales, KVCacheDtype.INT8, torch.float32) - values).abs()
    assert (error <= scales[..., None] / 2 * (1 + 1e-6)).all()
    assert (codes.abs().amax(dim=-1) == 127).all()  # every token uses its full range


def test_fp8_codes_are_torchs_e4m3_saturated() -> None:
    values = torch.tensor([0.1, -3.3, 1e-4, 447.0, 500.0, -1000.0])
    codes = quantize_fp8(values, torch.tensor(1.0))
    assert codes.dtype == torch.uint8
    decoded = dequantize(codes, torch.tensor(1.0), KVCacheDtype.FP8_E4M3, torch.float32)
    assert decoded.tolist() == values.to(torch.float8_e4m3fn).float().clamp(-448, 448).tolist()
    assert fp8_e4m3_table()[codes.long()].tolist() == decoded.tolist()


@pytest.mark.parametrize("kv_dtype", CODED)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 32), (8, 2, 64), (6, 2, 24)])
def test_c_kernel_attends_over_codes_as_over_their_values(
    kernel: CpuDecodeKernel, kv_dtype: KVCacheDtype, num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    torch.manual_seed(num_heads + head_dim)
    check_kernel_over_codes(kernel, kv_dtype, (num_heads, num_kv_heads, head_dim), LayerVariant(head_dim**-0.5))


@pytest.mark.parametrize("kv_dtype", CODED)
@pytest.mark.parametrize(("window", "softcap", "has_sinks"), VARIANTS)
def test_c_kernel_applies_the_layer_variant_over_codes(
    kernel: CpuDecodeKernel, kv_dtype: KVCacheDtype, window: int | None, softcap: float | None, has_sinks: bool
) -> None:
    torch.manual_seed(3)
    check_kernel_over_codes(kernel, kv_dtype, (4, 2, 32), layer_variant(32**-0.5, 4, window, softcap, has_sinks))


def check_kernel_over_codes(
    kernel: CpuDecodeKernel, kv_dtype: KVCacheDtype, heads: tuple[int, int, int], variant: LayerVariant
) -> None:
    """The C kernel's decode attention over a coded pool equals the reference over the values the codes stand for."""
    num_heads, num_kv_heads, head_dim = heads
    pool, tables = filled_pool(kv_dtype, num_kv_heads, head_dim, kernel)
    queries = torch.randn(len(LENS), num_heads, head_dim)
    k_cache, v_cache = pool.layer(0)
    out = kernel.attention(
        queries, k_cache, v_cache, tables, torch.tensor(LENS), max(LENS), variant, pool.kernel_codes[0]
    )
    for row, expected in enumerate(expected_decode(pool, queries, tables, variant)):
        torch.testing.assert_close(out[row : row + 1], expected, **TOLERANCE)


@pytest.mark.parametrize("kv_dtype", CODED)
def test_c_decode_step_stores_the_codes_torch_stores_and_attends_over_them(
    kernel: CpuDecodeKernel, kv_dtype: KVCacheDtype
) -> None:
    """Each row's last token is stored by the kernel's decode step in one pool and by KVPool.write in another: the
    same codes and scales, to the bit; the step's attention equals the reference over the stored values."""
    torch.manual_seed(11)
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    stepped, tables = filled_pool(kv_dtype, num_kv_heads, head_dim, kernel)
    written = KVPool(KVShape(1, num_kv_heads, head_dim), NUM_BLOCKS, BLOCK_SIZE, torch.float32, torch.device("cpu"),
                     True, kernel, kv_dtype=kv_dtype)  # fmt: skip
    written.cache.copy_(stepped.cache)
    written.scales.copy_(stepped.scales)
    lens = [length + 1 for length in LENS]  # one more token each, in the rows' own blocks
    positions = torch.tensor(lens) - 1
    slots_tensor = tables[torch.arange(len(lens)), positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    query = torch.randn(1, num_heads, len(lens), head_dim)
    key, value = (torch.randn(1, num_kv_heads, len(lens), head_dim) * 3 for _ in "kv")
    step = kernel.bind_decode_step(
        stepped.layers, slots_tensor, tables, torch.tensor(lens), max(lens), stepped.kernel_codes
    )
    out = step(0, query, key, value, LayerVariant(head_dim**-0.5))
    written.write(0, slots_tensor, key[0], value[0])
    assert torch.equal(stepped.cache, written.cache)
    assert torch.equal(stepped.scales, written.scales)
    keys, values = dequantized_layer(stepped)
    for row, length in enumerate(lens):
        expected = reference_attention(
            query[0, :, row][None], keys, values, tables[row], length - 1, LayerVariant(head_dim**-0.5)
        )
        torch.testing.assert_close(out[row : row + 1], expected, **TOLERANCE)


@pytest.mark.parametrize("kv_dtype", CODED)
def test_gathered_decode_reads_the_codes_back(kv_dtype: KVCacheDtype) -> None:
    """The SDPA path's gather: the blocks' codes times their tokens' scales, as dequantizing the whole pool gives."""
    torch.manual_seed(5)
    pool, tables = filled_pool(kv_dtype, 2, 32, None)
    keys, values = dequantized_layer(pool)
    k_cache, v_cache = pool.layer(0)
    block_ids = tables.flatten()
    k, v = pool.dequantized(0, gather_blocks(k_cache, block_ids), gather_blocks(v_cache, block_ids), block_ids)
    assert torch.equal(k, gather_blocks(keys, block_ids)) and torch.equal(v, gather_blocks(values, block_ids))
    length = tables.shape[1] * BLOCK_SIZE
    queries = torch.randn(len(LENS), 4, 32)
    is_padding = torch.arange(length)[None, :] >= torch.tensor(LENS)[:, None]
    bias = torch.zeros(is_padding.shape).masked_fill_(is_padding, float("-inf")).repeat(2, 1)[:, None]
    out = decode_attention(queries, k, v, bias, LayerVariant(32**-0.5))
    for row, expected in enumerate(expected_decode(pool, queries, tables, LayerVariant(32**-0.5))):
        torch.testing.assert_close(out[row : row + 1], expected, **TOLERANCE)


@needs_interpreter
@pytest.mark.parametrize("kv_dtype", CODED)
@pytest.mark.parametrize("keys_transposed", [False, True], ids=["sdpa-layout", "c-kernel-layout"])
def test_triton_decode_and_prefill_attend_over_codes(
    kernel: CpuDecodeKernel, kv_dtype: KVCacheDtype, keys_transposed: bool
) -> None:
    torch.manual_seed(7)
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    pool, tables = filled_pool(kv_dtype, num_kv_heads, head_dim, kernel if keys_transposed else None)
    keys, values = dequantized_layer(pool)
    k_cache, v_cache = pool.layer(0)
    scales = pool.layer_scales(0)
    variant = LayerVariant(head_dim**-0.5, sliding_window=21)
    tables32 = tables.to(torch.int32)
    queries = torch.randn(len(LENS), num_heads, head_dim)
    out = torch.empty_like(queries)
    rows = torch.arange(len(LENS), dtype=torch.int32)
    paged_decode(queries, k_cache, v_cache, tables32, torch.tensor(LENS, dtype=torch.int32), rows, out, variant, 1,
                 keys_transposed, kv_dtype, scales)  # fmt: skip
    for row, expected in enumerate(expected_decode(pool, queries, tables, variant)):
        torch.testing.assert_close(out[row : row + 1], expected, **TOLERANCE)
    # each row's last 5 tokens as a prefill chunk over the codes before them and their own
    chunk_lens = [min(5, length) for length in LENS]
    starts = torch.tensor([0, *torch.tensor(chunk_lens).cumsum(0)[:-1].tolist()], dtype=torch.int32)
    prefill_queries = torch.randn(sum(chunk_lens), num_heads, head_dim)
    prefill_out = torch.empty_like(prefill_queries)
    context_starts = torch.tensor([length - n for length, n in zip(LENS, chunk_lens, strict=True)], dtype=torch.int32)
    paged_prefill(prefill_queries, k_cache, v_cache, tables32, starts, torch.tensor(chunk_lens, dtype=torch.int32),
                  context_starts, max(chunk_lens), prefill_out, variant, keys_transposed, kv_dtype, scales)  # fmt: skip
    for row, (start, n) in enumerate(zip(starts.tolist(), chunk_lens, strict=True)):
        chunk = prefill_queries[start : start + n]
        expected = reference_attention(chunk, keys, values, tables[row], int(context_starts[row]), variant)
        torch.testing.assert_close(prefill_out[start : start + n], expected, **TOLERANCE)
