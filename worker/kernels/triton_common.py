"""What the Triton attention kernels share: how they address the KV pool's layouts and how they multiply."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from worker.kernels.kv_quant import KVCacheDtype
from worker.kernels.layer_variant import LayerVariant

LOG2_E = 1.4426950408889634  # the kernels keep scores in base 2, for exp2
KERNEL_LOG2_E = tl.constexpr(LOG2_E)  # the same, as a global that @triton.jit functions may read
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
def capped_scores(dot_products, scale_log2, cap_scale, cap_log2, HAS_SOFTCAP: tl.constexpr):
    """Scores in base 2: q . k times the scale, or soft-capped first as softcap * tanh(scale * q . k / softcap) (then
    cap_scale is scale / softcap and cap_log2 softcap * log2(e)). tanh through exp, which every backend has."""
    if HAS_SOFTCAP:
        x = dot_products * cap_scale
        t = tl.exp(-2.0 * tl.abs(x))
        magnitude = (1.0 - t) / (1.0 + t)
        return tl.where(x < 0, -magnitude, magnitude) * cap_log2
    return dot_products * scale_log2


@triton.jit
def with_sinks(max_score, sum_exp, acc, sinks_ptr, heads, mask_heads):
    """The running softmax of each head's row with its sink (a logit, in base e) joined as a key with no value:
    (max, sum of exp2, accumulated values) rescaled to the new max."""
    sinks = tl.load(sinks_ptr + heads, mask=mask_heads, other=0.0).to(tl.float32) * KERNEL_LOG2_E
    new_max = tl.maximum(max_score, sinks)
    rescale = tl.exp2(max_score - new_max)
    return new_max, sum_exp * rescale + tl.exp2(sinks - new_max), acc * rescale[:, None]


def variant_arguments(variant: LayerVariant, sinks_placeholder: torch.Tensor) -> dict[str, Any]:
    """The kernels' arguments for a layer's variant: a window of 0 is none; sinks_ptr points at `sinks_placeholder`
    (never read) when the layer has none."""
    softcap = variant.softcap or 1.0
    return {
        "sinks_ptr": sinks_placeholder if variant.sinks is None else variant.sinks,
        "window": variant.sliding_window or 0,
        "scale_log2": variant.scale * LOG2_E,
        "cap_scale": variant.scale / softcap,
        "cap_log2": softcap * LOG2_E,
        "HAS_SOFTCAP": variant.softcap is not None,
        "HAS_SINKS": variant.sinks is not None,
    }


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, IS_INTERPRETED: tl.constexpr):
    """a @ b accumulated in float32. The interpreter (triton 3.9) multiplies bfloat16 tiles as their raw 16-bit
    patterns, so there they are widened first: exact either way, as a GPU's bf16 products are."""
    if IS_INTERPRETED:
        a, b = a.to(tl.float32), b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


def codes_arguments(
    kv_dtype: KVCacheDtype, scales: tuple[torch.Tensor, torch.Tensor] | None, placeholder: torch.Tensor
) -> dict[str, Any]:
    """The kernels' arguments for a quantized pool: its kind of codes and the layer's K and V scales ([Hkv, slots],
    addressed through their strides); for a float pool, `placeholder` (never read) and KV_CODES 0."""
    if scales is None:
        return {"k_scales_ptr": placeholder, "v_scales_ptr": placeholder, "stride_sh": 0, "stride_st": 0, "KV_CODES": 0}
    k_scales, v_scales = scales
    stride_sh, stride_st = k_scales.stride()
    return {
        "k_scales_ptr": k_scales,
        "v_scales_ptr": v_scales,
        "stride_sh": stride_sh,
        "stride_st": stride_st,
        "KV_CODES": kv_dtype.code,
    }


@triton.jit
def load_kv(ptrs, mask_nd, scales_ptr, slots, mask_n, KV_CODES: tl.constexpr):
    """[N, D] keys or values from the pool: as stored, or float32 codes times their tokens' scales (KV_CODES 1: int8;
    2: float8 e4m3fn bytes, whose sign, exponent and mantissa bits are decoded here, as the interpreter has no fp8)."""
    kv = tl.load(ptrs, mask=mask_nd, other=0)
    if KV_CODES == 1:
        kv = kv.to(tl.float32) * tl.load(scales_ptr + slots, mask=mask_n, other=0.0)[:, None]
    elif KV_CODES == 2:
        bits = kv.to(tl.int32)
        exponent = (bits >> 3) & 15
        mantissa = (bits & 7).to(tl.float32)
        normal = (8.0 + mantissa) * tl.exp2((exponent - 10).to(tl.float32))  # (1 + m / 8) * 2 ** (e - 7)
        magnitude = tl.where(exponent == 0, mantissa * 0.001953125, normal)  # subnormals: m * 2 ** -9
        scales = tl.load(scales_ptr + slots, mask=mask_n, other=0.0)  # [N], scales_ptr at the KV head's first
        kv = tl.where((bits & 128) != 0, -magnitude, magnitude) * scales[:, None]
    return kv
