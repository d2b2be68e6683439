"""The Triton paged-attention kernels against attention written out over the same blocks, plain and with each layer
variant (sliding window, soft-cap, sinks): on CPU tensors under Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1 when there is no CUDA device), and compiled on CUDA (`gpu`
marker).

Tolerances: float32 1e-5 (absolute and relative; the kernels multiply in full float32, measured errors at most
1.1e-6). bfloat16 3e-2 absolute, 2e-2 relative against a float32 reference over the same bfloat16 inputs (measured at
most 5.3e-3 in decode, 1.6e-2 in prefill): the kernels round the softmax weights to bfloat16 before multiplying the
values, as flash attention does, and round the output.
"""

from __future__ import annotations

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from tests.worker.kernels.attention_reference import VARIANTS, layer_variant, reference_attention
from worker.kernels import triton_decode, triton_prefill
from worker.kernels.triton_decode import num_decode_splits, paged_decode
from worker.kernels.triton_prefill import paged_prefill

TOLERANCES = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2}}
DEVICES = [
    pytest.param(
        "cpu", marks=pytest.mark.skipif(not triton_decode.IS_INTERPRETED, reason="compiled kernels take CUDA tensors")
    ),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]
NUM_BLOCKS = 48
GAP = 2  # packed-step tokens between two chunks that belong to neither kernel: they must stay untouched


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def random_pool(
    num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, device: str, keys_transposed: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values [Hkv, blocks, block_size, D], and the keys as the kernel reads them (maybe transposed within
    blocks, as a pool with the CPU decode kernel stores them)."""
    keys, values = (torch.randn(num_kv_heads, NUM_BLOCKS, block_size, head_dim).to(device, dtype) for _ in "kv")
    stored_keys = keys.transpose(2, 3).contiguous() if keys_transposed else keys
    return keys, values, stored_keys


def scattered_tables(ends: list[int], block_size: int, device: str) -> torch.Tensor:
    """[R, W] int32: distinct blocks in random order for each row's first `end` tokens, padded with block 0."""
    width = max(cdiv(end, block_size) for end in ends)
    tables = torch.randperm(NUM_BLOCKS)[: len(ends) * width].view(len(ends), width)
    for row, end in enumerate(ends):
        tables[row, cdiv(end, block_size) :] = 0
    return tables.to(device, torch.int32)


def packed_queries(num_tokens: int, num_heads: int, head_dim: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """[N, H, D] whose token and head strides are not those of a contiguous tensor."""
    return torch.randn(num_tokens, num_heads, 2 * head_dim).to(device, dtype)[..., :head_dim]


# (query heads, KV heads, head dim, block size, dtype, splits, keys transposed)
DECODE_CASES = [
    (2, 2, 64, 16, torch.float32, 1, False),  # no GQA
    (4, 1, 64, 32, torch.bfloat16, 1, False),  # 4 query heads per KV head
    (8, 1, 128, 16, torch.float32, 1, True),  # 8 per KV head; keys in the CPU decode kernel's layout
    (8, 1, 128, 256, torch.float32, 4, False),  # split-K within one 256-token block
    (4, 1, 64, 256, torch.bfloat16, 2, False),
    (1, 1, 128, 32, torch.bfloat16, 8, False),  # more splits than short rows have tiles: empty splits merge as nothing
    (3, 1, 80, 24, torch.float32, 2, False),  # a group of 3, a head dim and a block size no power of two
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "num_splits", "keys_transposed"), DECODE_CASES
)
def test_paged_decode_equals_the_reference(
    device: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    num_splits: int,
    keys_transposed: bool,
) -> None:
    check_paged_decode(device, num_heads, num_kv_heads, head_dim, block_size, dtype, num_splits, keys_transposed)


# (window, soft-cap, sinks) x (query heads, KV heads, block size, splits): split-K merges the sinks
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("window", "softcap", "has_sinks"), VARIANTS)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "block_size", "num_splits"), [(4, 2, 16, 1), (4, 1, 32, 4)])
def test_paged_decode_applies_the_layer_variant(
    device: str,
    window: int | None,
    softcap: float | None,
    has_sinks: bool,
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    num_splits: int,
) -> None:
    shape = (num_heads, num_kv_heads, 32, block_size, torch.float32, num_splits, False)
    check_paged_decode(device, *shape, variant=(window, softcap, has_sinks))


def check_paged_decode(
    device: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    num_splits: int,
    keys_transposed: bool,
    variant: tuple[int | None, float | None, bool] = (None, None, False),
) -> None:
    torch.manual_seed(num_heads * 1000 + head_dim + block_size + num_splits)
    layer = layer_variant(head_dim**-0.5, num_heads, *variant, device=device)
    keys, values, stored_keys = random_pool(num_kv_heads, head_dim, block_size, dtype, device, keys_transposed)
    lens = sorted({1, block_size - 1, block_size, block_size + 1, 2 * block_size + 3, 70} - {0})  # across blocks
    tables = scattered_tables(lens, block_size, device)
    token_index = [GAP + row * (GAP + 1) for row in range(len(lens))]  # decode rows among other tokens
    queries = packed_queries(token_index[-1] + GAP + 1, num_heads, head_dim, dtype, device)
    out = torch.full(queries.shape, float("nan"), dtype=dtype, device=device)

    paged_decode(
        queries, stored_keys, values, tables, torch.tensor(lens, dtype=torch.int32, device=device),
        torch.tensor(token_index, dtype=torch.int32, device=device), out, layer, num_splits, keys_transposed,
    )  # fmt: skip

    for row, (token, length) in enumerate(zip(token_index, lens, strict=True)):
        expected = reference_attention(queries[token : token + 1], keys, values, tables[row], length - 1, layer)
        torch.testing.assert_close(out[token : token + 1].float(), expected, **TOLERANCES[dtype])
    assert out[[t for t in range(len(out)) if t not in token_index]].isnan().all()  # nothing else written


# (query heads, KV heads, head dim, block size, dtype, keys transposed)
PREFILL_CASES = [
    (2, 2, 64, 16, torch.float32, False),  # no GQA
    (4, 1, 128, 32, torch.bfloat16, False),  # 4 query heads per KV head
    (8, 1, 64, 256, torch.bfloat16, False),  # 8 per KV head
    (8, 1, 64, 16, torch.float32, False),
    (1, 1, 128, 256, torch.float32, False),
    (4, 2, 32, 16, torch.float32, True),  # the tiny model's shape, keys in the CPU decode kernel's layout
    (3, 1, 80, 24, torch.float32, False),  # a group of 3, a head dim and a block size no power of two
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "keys_transposed"), PREFILL_CASES
)
def test_paged_prefill_equals_the_causal_reference(
    device: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    keys_transposed: bool,
) -> None:
    check_paged_prefill(device, num_heads, num_kv_heads, head_dim, block_size, dtype, keys_transposed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("window", "softcap", "has_sinks"), VARIANTS)
def test_paged_prefill_applies_the_layer_variant(
    device: str, window: int | None, softcap: float | None, has_sinks: bool
) -> None:
    check_paged_prefill(device, 4, 2, 32, 16, torch.float32, False, variant=(window, softcap, has_sinks))


def check_paged_prefill(
    device: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    keys_transposed: bool,
    variant: tuple[int | None, float | None, bool] = (None, None, False),
) -> None:
    torch.manual_seed(num_heads * 1000 + head_dim + block_size)
    layer = layer_variant(head_dim**-0.5, num_heads, *variant, device=device)
    keys, values, stored_keys = random_pool(num_kv_heads, head_dim, block_size, dtype, device, keys_transposed)
    # (tokens already cached, chunk length): a one-token prompt, a first chunk of two query tiles, a later chunk
    # crossing a block boundary, a speculative verify chunk after two blocks
    chunks = [(0, 1), (0, 70), (block_size - 3, 7), (2 * block_size + 1, 5)]
    tables = scattered_tables([start + length for start, length in chunks], block_size, device)
    query_starts = [GAP + sum(length + GAP for _, length in chunks[:row]) for row in range(len(chunks))]
    queries = packed_queries(query_starts[-1] + chunks[-1][1] + GAP, num_heads, head_dim, dtype, device)
    out = torch.full(queries.shape, float("nan"), dtype=dtype, device=device)

    def int32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    lengths = [length for _, length in chunks]
    paged_prefill(
        queries, stored_keys, values, tables, int32(query_starts), int32(lengths), int32([s for s, _ in chunks]),
        max(lengths), out, layer, keys_transposed,
    )  # fmt: skip

    written = set()
    for row, ((start, length), first) in enumerate(zip(chunks, query_starts, strict=True)):
        expected = reference_attention(queries[first : first + length], keys, values, tables[row], start, layer)
        torch.testing.assert_close(out[first : first + length].float(), expected, **TOLERANCES[dtype])
        written.update(range(first, first + length))
    assert out[[t for t in range(len(out)) if t not in written]].isnan().all()


def test_the_kernels_run_under_the_interpreter_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("with a CUDA device the kernels are compiled")
    assert isinstance(triton_decode._decode_kernel, InterpretedFunction)
    assert isinstance(triton_prefill._prefill_kernel, InterpretedFunction)


@pytest.mark.parametrize(
    ("num_rows", "num_kv_heads", "max_len", "num_sms", "expected"),
    [
        (1, 8, 4096, 132, 16),  # one long row: as many splits as allowed
        (2, 8, 1024, 132, 4),  # each split at least 256 tokens
        (4, 8, 4096, 132, 4),  # 32 programs: 4 splits fill 128 of 132 SMs
        (3, 8, 4096, 132, 4),  # 24 programs: 5 would fill them, a power of two is taken
        (64, 8, 4096, 132, 1),  # the rows alone fill the device
        (1, 8, 300, 132, 1),  # too short to split
        (1, 8, 4096, 1, 1),  # the interpreter: one program at a time
    ],
)
def test_decode_splits_fill_the_device_without_short_splits(
    num_rows: int, num_kv_heads: int, max_len: int, num_sms: int, expected: int
) -> None:
    assert num_decode_splits(num_rows, num_kv_heads, max_len, num_sms) == expected
