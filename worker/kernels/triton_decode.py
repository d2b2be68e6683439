"""Paged decode attention in Triton: one query token per row against its context, read from the KV pool's blocks in
place through the row's block table.

One program per (row, KV head, split): the group's query heads (GQA) share each key and value load, as the rows of
one `tl.dot`. Any block size: a tile's token positions map to (block, offset) one by one, so tiles need not align
with blocks. Split-K (flash-decoding): with few rows the (row, KV head) grid leaves most SMs idle on a long context,
so each row's context is cut into `num_splits` parts attended by separate programs and merged by their
log-sum-exps in a second kernel. The parts are cut on the device from each row's own length, so a fixed split count
serves every step (as a captured CUDA graph needs).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from worker.kernels.kv_quant import KVCacheDtype
from worker.kernels.layer_variant import LayerVariant
from worker.kernels.triton_common import (
    KERNEL_LOG2_E,
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

MIN_SPLIT_TOKENS = 256  # a split shorter than this costs more in its merge than its parallelism saves
MAX_SPLITS = 16
IS_INTERPRETED = is_interpreted()  # as the kernels below are defined: compiled, or run by the interpreter


@triton.jit
def _decode_kernel(
    query_ptr,  # [N, H, D]: the step's packed queries, any strides
    k_cache_ptr,  # one layer's keys, addressed through (head, block, token, dim) strides
    v_cache_ptr,  # one layer's values, likewise
    block_tables_ptr,  # [B, W] int32
    context_lens_ptr,  # [B] int32: tokens each row attends to, its new one included
    token_index_ptr,  # [B] int32: each row's position in the packed queries and output
    out_ptr,  # [N, H, D] contiguous (num_splits 1), else the splits' partial outputs [B, H, S, D] float32
    lse_ptr,  # [B, H, S] float32: each split's log2-sum-exp2 of scores (unused with one split)
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
    sinks_ptr,  # [H]: each query head's sink logit (read with HAS_SINKS, and only with one split)
    window,  # a row sees its `window` latest tokens; 0: all of them
    scale_log2,  # softmax scale times log2(e)
    cap_scale,  # with HAS_SOFTCAP: scale / softcap
    cap_log2,  # with HAS_SOFTCAP: softcap * log2(e)
    k_scales_ptr,  # a quantized pool's K scales, at (KV head, slot) through the two strides below (KV_CODES > 0)
    v_scales_ptr,
    stride_sh,
    stride_st,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    IS_INTERPRETED: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    KV_CODES: tl.constexpr,  # 0: the pool holds K/V as they are; 1: int8 codes; 2: float8 e4m3fn bytes
):
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(context_lens_ptr + row)
    token = tl.load(token_index_ptr + row)
    first = tl.where(window > 0, tl.maximum(length - window, 0), 0)  # the row's first visible token
    split_len = tl.cdiv(tl.cdiv(length - first, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * split_len
    end = tl.minimum(start + split_len, length)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + offs_g  # [G]
    mask_g, mask_d = offs_g < GROUP, offs_d < head_dim
    q_ptrs = query_ptr + token * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    query = tl.load(q_ptrs, mask=mask_g[:, None] & mask_d[None, :], other=0.0)  # [G, D]

    max_score = tl.full([BLOCK_G], float("-inf"), tl.float32)
    sum_exp = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    kv_head = kv_head.to(tl.int64)  # a large pool's offsets pass 2**31 elements
    k_head, v_head = k_cache_ptr + kv_head * stride_kh, v_cache_ptr + kv_head * stride_vh
    k_scales, v_scales = k_scales_ptr + kv_head * stride_sh, v_scales_ptr + kv_head * stride_sh
    for tile in range(start, end, BLOCK_N):
        offs_n = tile + tl.arange(0, BLOCK_N)  # [N] token positions in the row
        mask_n = offs_n < end
        blocks = tl.load(block_tables_ptr + row * stride_table + offs_n // block_size, mask=mask_n, other=0).to(
            tl.int64
        )
        within = offs_n % block_size
        mask_nd = mask_n[:, None] & mask_d[None, :]
        k_ptrs = k_head + blocks[:, None] * stride_kb + within[:, None] * stride_kt + offs_d[None, :] * stride_kd
        slots = (blocks * block_size + within) * stride_st
        keys = load_kv(k_ptrs, mask_nd, k_scales, slots, mask_n, KV_CODES).to(query.dtype)  # [N, D]
        products = dot(query, tl.trans(keys), DOT_PRECISION, IS_INTERPRETED)
        scores = capped_scores(products, scale_log2, cap_scale, cap_log2, HAS_SOFTCAP)  # [G, N]
        scores = tl.where(mask_n[None, :], scores, float("-inf"))
        new_max = tl.maximum(max_score, tl.max(scores, 1))
        rescale = tl.exp2(max_score - new_max)
        probs = tl.exp2(scores - new_max[:, None])  # [G, N]
        sum_exp = sum_exp * rescale + tl.sum(probs, 1)
        v_ptrs = v_head + blocks[:, None] * stride_vb + within[:, None] * stride_vt + offs_d[None, :] * stride_vd
        values = load_kv(v_ptrs, mask_nd, v_scales, slots, mask_n, KV_CODES).to(query.dtype)  # [N, D]
        acc = acc * rescale[:, None] + dot(probs.to(values.dtype), values, DOT_PRECISION, IS_INTERPRETED)
        max_score = new_max

    mask_gd = mask_g[:, None] & mask_d[None, :]
    if HAS_SINKS and NUM_SPLITS == 1:  # with splits, the merge adds them
        max_score, sum_exp, acc = with_sinks(max_score, sum_exp, acc, sinks_ptr, heads, mask_g)
    if NUM_SPLITS == 1:
        out_ptrs = out_ptr + (token * num_heads + heads[:, None]) * head_dim + offs_d[None, :]
        tl.store(out_ptrs, (acc / sum_exp[:, None]).to(out_ptr.dtype.element_ty), mask=mask_gd)
    else:  # an empty split (a short row) leaves -inf and zeros, which the merge weighs as nothing
        partial = (row * num_heads + heads) * NUM_SPLITS + split  # [G]
        safe_sum = tl.where(sum_exp > 0, sum_exp, 1.0)
        tl.store(out_ptr + partial[:, None] * head_dim + offs_d[None, :], acc / safe_sum[:, None], mask=mask_gd)
        tl.store(lse_ptr + partial, max_score + tl.log2(safe_sum), mask=mask_g)


@triton.jit
def _merge_splits_kernel(
    partial_ptr,  # [B, H, S, D] float32
    lse_ptr,  # [B, H, S] float32
    token_index_ptr,  # [B] int32
    sinks_ptr,  # [H]: each query head's sink logit, read with HAS_SINKS
    out_ptr,  # [N, H, D]
    num_heads,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    row, head = tl.program_id(0), tl.program_id(1)
    offs_s, offs_d = tl.arange(0, NUM_SPLITS), tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    base = (row * num_heads + head) * NUM_SPLITS
    lse = tl.load(lse_ptr + base + offs_s)  # [S]
    top = tl.max(lse, 0)  # the first split is never empty, so the max is finite
    if HAS_SINKS:  # the head's sink joins the softmax as one more split with no value
        sink = tl.load(sinks_ptr + head).to(tl.float32) * KERNEL_LOG2_E
        top = tl.maximum(top, sink)
    weights = tl.exp2(lse - top)
    total = tl.sum(weights, 0)
    if HAS_SINKS:
        total += tl.exp2(sink - top)
    partial = tl.load(partial_ptr + (base + offs_s[:, None]) * head_dim + offs_d[None, :], mask=mask_d[None, :])
    merged = tl.sum(partial * weights[:, None], 0) / total  # [D]
    token = tl.load(token_index_ptr + row)
    tl.store(out_ptr + (token * num_heads + head) * head_dim + offs_d, merged.to(out_ptr.dtype.element_ty), mask=mask_d)


def paged_decode(
    query: torch.Tensor,  # [N, H, D] the step's packed queries, any strides
    k_cache: torch.Tensor,  # [Hkv, blocks, block_size, D], or [Hkv, blocks, D, block_size] with `keys_transposed`
    v_cache: torch.Tensor,  # [Hkv, blocks, block_size, D]
    block_tables: torch.Tensor,  # [B, W] int32, contiguous rows
    context_lens: torch.Tensor,  # [B] int32, each at least 1
    token_index: torch.Tensor,  # [B] int32: the rows' positions in `query` and `out`
    out: torch.Tensor,  # [N, H, D] contiguous: the rows' attention is written at `token_index`
    variant: LayerVariant,
    num_splits: int = 1,  # a power of two
    keys_transposed: bool = False,
    kv_dtype: KVCacheDtype = KVCacheDtype.AUTO,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,  # a quantized pool's layer's K and V scales [Hkv, slots]
) -> None:
    if num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, not {num_splits}")
    num_rows = block_tables.shape[0]
    _, num_heads, head_dim = query.shape
    num_kv_heads, block_size = v_cache.shape[0], v_cache.shape[2]
    if num_splits > 1:
        partial = torch.empty(num_rows, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(num_rows, num_heads, num_splits, dtype=torch.float32, device=query.device)
    else:
        partial, lse = out, out  # the kernel writes the output itself; lse is never touched
    variant_args = variant_arguments(variant, out)
    _decode_kernel[(num_rows, num_kv_heads, num_splits)](
        query,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        token_index,
        partial,
        lse,
        *query.stride(),
        *kv_strides(k_cache, keys_transposed),
        *kv_strides(v_cache, False),
        block_tables.stride(0),
        block_size,
        num_heads,
        head_dim,
        **decode_constants(num_heads // num_kv_heads, head_dim, query.dtype, num_splits),
        **variant_args,
        **codes_arguments(kv_dtype, scales, out),
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_rows, num_heads)](
            partial,
            lse,
            token_index,
            variant_args["sinks_ptr"],
            out,
            num_heads,
            head_dim,
            HAS_SINKS=variant_args["HAS_SINKS"],
            **merge_constants(head_dim, num_splits),
        )


def decode_constants(group: int, head_dim: int, dtype: torch.dtype, num_splits: int) -> dict[str, Any]:
    """The decode kernel's compile-time arguments for `group` query heads per KV head."""
    block_d = padded_size(head_dim)
    return {
        "GROUP": group,
        "BLOCK_G": padded_size(group),
        "BLOCK_D": block_d,
        "BLOCK_N": tile_size(block_d, dtype),
        "NUM_SPLITS": num_splits,
        "DOT_PRECISION": dot_precision(dtype),
        "IS_INTERPRETED": IS_INTERPRETED,
    }


def merge_constants(head_dim: int, num_splits: int) -> dict[str, Any]:
    return {"NUM_SPLITS": num_splits, "BLOCK_D": padded_size(head_dim)}


def num_decode_splits(num_rows: int, num_kv_heads: int, max_len: int, num_sms: int) -> int:
    """Splits per row: enough programs to fill the device's `num_sms`, none shorter than MIN_SPLIT_TOKENS; a power of
    two, at most MAX_SPLITS."""
    wanted = min(num_sms // max(1, num_rows * num_kv_heads), max_len // MIN_SPLIT_TOKENS, MAX_SPLITS)
    return 1 if wanted < 2 else 1 << (wanted.bit_length() - 1)
