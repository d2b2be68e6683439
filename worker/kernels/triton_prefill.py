"""Paged prefill attention in Triton: each chunk's queries attend causally to their row's earlier tokens and to the
chunk itself, all read from the KV pool's blocks in place (the chunk's own K/V are written there first).

One kernel serves a first chunk, a later chunk of a long prompt and a speculative verify chunk alike: a chunk is
(its queries' span of the packed step, its first token's position in the row, the row's block table), and query i
of a chunk starting at position p sees the row's tokens 0..p + i. One program per (chunk, tile of queries, query
head); tiles past a chunk's end return at once, and a tile stops reading keys at its last query's position.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from worker.kernels.kv_quant import KVCacheDtype
from worker.kernels.layer_variant import LayerVariant
from worker.kernels.triton_common import (
    capped_scores,
    codes_arguments,
    dot,
    dot_precision,
    is_interpreted,
    kv_strides,
    load_kv,
    padded_size,
    tile_size,
    variant_arguments,
    with_sinks,
)

IS_INTERPRETED = is_interpreted()  # as the kernel below is defined: compiled, or run by the interpreter


@triton.jit
def _prefill_kernel(
    query_ptr,  # [N, H, D]: the step's packed queries, any strides
    k_cache_ptr,  # one layer's keys, addressed through (head, block, token, dim) strides
    v_cache_ptr,  # one layer's values, likewise
    block_tables_ptr,  # [R, W] int32
    query_starts_ptr,  # [R] int32: each chunk's first query in the packed step
    query_lens_ptr,  # [R] int32: each chunk's tokens
    context_starts_ptr,  # [R] int32: each chunk's first token's position in its row (tokens already cached)
    out_ptr,  # [N, H, D] contiguous
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kh,
    stride_kb,
    stride_kt,
    stride_kd,
    stride_vh,
    stride_vb,
    stride_vt,
    stride_vd,
    stride_table,
    block_size,
    num_heads,
    head_dim,
    sinks_ptr,  # [H]: each query head's sink logit, read with HAS_SINKS
    window,  # a query sees its `window` latest tokens, itself included; 0: all of them
    scale_log2,  # softmax scale times log2(e)
    cap_scale,  # with HAS_SOFTCAP: scale / softcap
    cap_log2,  # with HAS_SOFTCAP: softcap * log2(e)
    k_scales_ptr,  # a quantized pool's K scales, at (KV head, slot) through the two strides below (KV_CODES > 0)
    v_scales_ptr,
    stride_sh,
    stride_st,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    IS_INTERPRETED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    KV_CODES: tl.constexpr,  # 0: the pool holds K/V as they are; 1: int8 codes; 2: float8 e4m3fn bytes
):
    chunk, tile, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    query_len = tl.load(query_lens_ptr + chunk)
    if tile * BLOCK_M >= query_len:
        return
    query_start = tl.load(query_starts_ptr + chunk)
    context_start = tl.load(context_starts_ptr + chunk)

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m, mask_d = offs_m < query_len, offs_d < head_dim
    positions = context_start + offs_m  # [M] each query's position in its row: it sees keys 0..position
    q_ptrs = query_ptr + (query_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd
    query = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [M, D]

    max_score = tl.full([BLOCK_M], float("-inf"), tl.float32)
    sum_exp = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    kv_head = head // GROUP
    kv_head = kv_head.to(tl.int64)  # a large pool's offsets pass 2**31 elements
    k_head, v_head = k_cache_ptr + kv_head * stride_kh, v_cache_ptr + kv_head * stride_vh
    k_scales, v_scales = k_scales_ptr + kv_head * stride_sh, v_scales_ptr + kv_head * stride_sh
    kv_end = context_start + tl.minimum((tile + 1) * BLOCK_M, query_len)  # one past the tile's last query
    kv_start = tl.where(window > 0, tl.maximum(context_start + tile * BLOCK_M - window + 1, 0), 0)  # its first's
    for kv_tile in range(kv_start, kv_end, BLOCK_N):
        offs_n = kv_tile + tl.arange(0, BLOCK_N)  # [N] key positions in the row
        mask_n = offs_n < kv_end
        blocks = tl.load(block_tables_ptr + chunk * stride_table + offs_n // block_size, mask=mask_n, other=0).to(
            tl.int64
        )
        within = offs_n % block_size
        mask_nd = mask_n[:, None] & mask_d[None, :]
        k_ptrs = k_head + blocks[:, None] * stride_kb + within[:, None] * stride_kt + offs_d[None, :] * stride_kd
        slots = (blocks * block_size + within) * stride_st
        keys = load_kv(k_ptrs, mask_nd, k_scales, slots, mask_n, KV_CODES).to(query.dtype)  # [N, D]
        products = dot(query, tl.trans(keys), DOT_PRECISION, IS_INTERPRETED)
        scores = capped_scores(products, scale_log2, cap_scale, cap_log2, HAS_SOFTCAP)  # [M, N]
        is_visible = (offs_n[None, :] <= positions[:, None]) & mask_n[None, :]
        is_visible &= (window == 0) | (offs_n[None, :] > positions[:, None] - window)
        scores = tl.where(is_visible, scores, float("-inf"))
        # a query that sees no key of the tiles so far (its window starting past them) keeps a max of -inf: taken as 0,
        # so that exp2 gives 0s rather than NaN
        new_max = tl.maximum(max_score, tl.max(scores, 1))
        new_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        rescale = tl.exp2(max_score - new_max)
        probs = tl.exp2(scores - new_max[:, None])  # [M, N]
        sum_exp = sum_exp * rescale + tl.sum(probs, 1)
        v_ptrs = v_head + blocks[:, None] * stride_vb + within[:, None] * stride_vt + offs_d[None, :] * stride_vd
        values = load_kv(v_ptrs, mask_nd, v_scales, slots, mask_n, KV_CODES).to(query.dtype)  # [N, D]
        acc = acc * rescale[:, None] + dot(probs.to(values.dtype), values, DOT_PRECISION, IS_INTERPRETED)
        max_score = new_max

    if HAS_SINKS:
        max_score, sum_exp, acc = with_sinks(max_score, sum_exp, acc, sinks_ptr, head + tl.zeros_like(offs_m), mask_m)
    out_ptrs = out_ptr + ((query_start + offs_m)[:, None] * num_heads + head) * head_dim + offs_d[None, :]
    sum_exp = tl.where(mask_m, sum_exp, 1.0)  # tile rows past the chunk, never stored, may see no key in a window
    tl.store(out_ptrs, (acc / sum_exp[:, None]).to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def paged_prefill(
    query: torch.Tensor,  # [N, H, D] the step's packed queries, any strides
    k_cache: torch.Tensor,  # [Hkv, blocks, block_size, D], or [Hkv, blocks, D, block_size] with `keys_transposed`
    v_cache: torch.Tensor,  # [Hkv, blocks, block_size, D]
    block_tables: torch.Tensor,  # [R, W] int32, contiguous rows: each chunk's row's blocks
    query_starts: torch.Tensor,  # [R] int32: each chunk's first query in `query` and `out`
    query_lens: torch.Tensor,  # [R] int32, each at least 1
    context_starts: torch.Tensor,  # [R] int32: the chunk's first token's position in its row
    max_query_len: int,
    out: torch.Tensor,  # [N, H, D] contiguous: the chunks' attention is written at their spans
    variant: LayerVariant,
    keys_transposed: bool = False,
    kv_dtype: KVCacheDtype = KVCacheDtype.AUTO,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,  # a quantized pool's layer's K and V scales [Hkv, slots]
) -> None:
    """Attention of every chunk's queries over its row's K/V in the pool, which must already hold the chunk's own."""
    _, num_heads, head_dim = query.shape
    num_kv_heads, block_size = v_cache.shape[0], v_cache.shape[2]
    constants = prefill_constants(num_heads // num_kv_heads, head_dim, query.dtype)
    grid = (block_tables.shape[0], triton.cdiv(max_query_len, constants["BLOCK_M"]), num_heads)
    _prefill_kernel[grid](
        query,
        k_cache,
        v_cache,
        block_tables,
        query_starts,
        query_lens,
        context_starts,
        out,
        *query.stride(),
        *kv_strides(k_cache, keys_transposed),
        *kv_strides(v_cache, False),
        block_tables.stride(0),
        block_size,
        num_heads,
        head_dim,
        **constants,
        **variant_arguments(variant, out),
        **codes_arguments(kv_dtype, scales, out),
    )


def prefill_constants(group: int, head_dim: int, dtype: torch.dtype) -> dict[str, Any]:
    """The prefill kernel's compile-time arguments for `group` query heads per KV head."""
    block_d = padded_size(head_dim)
    tile = tile_size(block_d, dtype)  # queries per program, and keys per step of its loop
    return {
        "GROUP": group,
        "BLOCK_M": tile,
        "BLOCK_D": block_d,
        "BLOCK_N": tile,
        "DOT_PRECISION": dot_precision(dtype),
        "IS_INTERPRETED": IS_INTERPRETED,
    }
