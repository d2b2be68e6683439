"""What the Triton attention kernels share: how they address the KV pool's layouts and how they multiply."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634  # the kernels keep scores in base 2, for exp2
MIN_DOT_SIZE = 16  # tl.dot's smallest tile side on GPUs: narrower heads and groups are padded and masked


def kv_strides(cache: torch.Tensor, is_transposed: bool) -> tuple[int, int, int, int]:
    """The (head, block, token, dim) strides of one layer's heads-major K or V: [Hkv, blocks, block_size, D], or keys
    stored [Hkv, blocks, D, block_size] (transposed within blocks, as a pool with the CPU decode kernel keeps them)."""
    head, block, third, fourth = cache.stride()
    return (head, block, fourth, third) if is_transposed else (head, block, third, fourth)


def dot_precision(dtype: torch.dtype) -> str:
    """float32 products in full float32 ("ieee"), not TF32, so float32 output matches PyTorch's; 16-bit inputs are
    multiplied exactly whatever this says."""
    return "ieee" if dtype == torch.float32 else "tf32"


def padded_size(size: int) -> int:
    """A tile side covering `size`: a power of two, at least MIN_DOT_SIZE."""
    return max(MIN_DOT_SIZE, triton.next_power_of_2(size))


def tile_size(block_d: int, dtype: torch.dtype) -> int:
    """Keys (and prefill queries) per tile: 64, halved for float32 and again for heads wider than 128, so that a
    tile's operands stay in registers (float32 tiles of 64 x 128 spill, and take ptxas tens of seconds)."""
    size = 64 if dtype.itemsize <= 2 else 32
    return size if block_d <= 128 else size // 2


def is_interpreted() -> bool:
    """Whether kernels defined from now on run under Triton's CPU interpreter (TRITON_INTERPRET=1 when defined)."""
    return bool(triton.knobs.runtime.interpret)


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, IS_INTERPRETED: tl.constexpr):
    """a @ b accumulated in float32. The interpreter (triton 3.9) multiplies bfloat16 tiles as their raw 16-bit
    patterns, so there they are widened first: exact either way, as a GPU's bf16 products are."""
    if IS_INTERPRETED:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)
