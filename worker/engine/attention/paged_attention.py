"""Our attention function for transformers' AttentionInterface: K/V into the pool's blocks, attention over them.

The model calls it once per layer with the packed sequence's query, key and value (after RoPE), and with the step's
`PagedStep` and the `KVPool` as keyword arguments that the model passes through to attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from worker.engine.attention.kv_pool import KVPool
from worker.engine.attention.paged_step import PagedStep

SDPA_BACKEND = "steerbatch_paged_sdpa"
FLASH_BACKEND = "steerbatch_paged_flash"


def paged_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H, N, D]
    key: torch.Tensor,  # [1, Hkv, N, D]
    value: torch.Tensor,  # [1, Hkv, N, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    paged_step: PagedStep | None = None,
    kv_pool: KVPool | None = None,
    kv_cache: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if paged_step is None:  # under torch.compile (worker/engine/compiled_forward.py): the op finds the step itself
        output = torch.ops.steerbatch.paged_attention(query, key, value, kv_cache, module.layer_idx, scale)
    else:
        output = paged_sdpa_attention_at(module.layer_idx, query, key, value, scale, paged_step, kv_pool)
    return output[None], None  # [1, N, H, D]


def paged_sdpa_attention_at(
    layer_idx: int,
    query: torch.Tensor,  # [1, H, N, D]
    key: torch.Tensor,  # [1, Hkv, N, D]
    value: torch.Tensor,  # [1, Hkv, N, D]
    scale: float,
    paged_step: PagedStep,
    kv_pool: KVPool,
) -> torch.Tensor:
    """[N, H, D], a new tensor: layer `layer_idx`'s attention for every token of the step, after writing their
    K/V into the pool."""
    if paged_step.triton is not None:  # the Triton kernels: every row over its blocks in place, two launches
        return paged_step.triton(layer_idx, query, key, value, scale, kv_pool)
    table = paged_step.decode_table
    if table is not None and table.kernel_step is not None:  # most steps: every token a decode row, one call
        return table.kernel_step(layer_idx, query, key, value, scale)
    k_cache, v_cache = kv_pool.layer(layer_idx)  # [Hkv, blocks, block_size, D]; keys maybe [Hkv, blocks, D, bs]
    queries = query[0].transpose(0, 1)  # [N, H, D]
    kv_pool.write(layer_idx, paged_step.slot_mapping, key[0], value[0])
    output = torch.empty_like(queries)
    if table is not None and kv_pool.decode_kernel is not None:  # decode rows among prefill chunks
        rows = queries.index_select(0, table.token_index)
        output[table.token_index] = kv_pool.decode_kernel.attention(
            rows, k_cache, v_cache, table.block_tables, table.context_lens, table.max_len, scale
        )
    for decode in paged_step.decode_groups:
        q = queries.index_select(0, decode.token_index)  # [Bd, H, D]
        k = gather_blocks(k_cache, decode.block_ids)  # [Hkv, Bd * W * block_size, D]
        v = gather_blocks(v_cache, decode.block_ids)
        output[decode.token_index] = decode_attention(q, k, v, decode.score_bias, scale)
    for chunk in paged_step.prefills:
        q = queries[chunk.tokens].transpose(0, 1)[None]  # [1, H, n, D]
        if chunk.is_first:
            k, v = key[:, :, chunk.tokens], value[:, :, chunk.tokens]  # [1, Hkv, n, D]
        else:
            k = gather_keys(k_cache, chunk.block_ids, kv_pool.keys_transposed)[None, :, : chunk.end]  # [1, Hkv, end, D]
            v = gather_blocks(v_cache, chunk.block_ids)[None, :, : chunk.end]
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=chunk.causal_mask, is_causal=chunk.is_first, scale=scale, enable_gqa=True
        )
        output[chunk.tokens] = attended[0].transpose(0, 1)
    return output


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """The listed blocks of a heads-major layer cache [Hkv, blocks, block_size, D], as [Hkv, len * block_size, D]:
    whole blocks at a time, each KV head's tokens contiguous, so the matmuls that follow need no copy."""
    return cache.index_select(1, block_ids).flatten(1, 2)


def gather_keys(cache: torch.Tensor, block_ids: torch.Tensor, is_transposed: bool) -> torch.Tensor:
    """`gather_blocks` for keys, which a pool with the CPU decode kernel stores transposed within blocks."""
    if not is_transposed:
        return gather_blocks(cache, block_ids)
    blocks = cache.index_select(1, block_ids)  # [Hkv, nb, D, block_size]
    return blocks.transpose(2, 3).reshape(blocks.shape[0], -1, blocks.shape[2])


def decode_attention(
    query: torch.Tensor,  # [B, H, D], one query token per row
    key: torch.Tensor,  # [Hkv, B * L, D], row b's context at [b * L, (b + 1) * L)
    value: torch.Tensor,  # [Hkv, B * L, D]
    score_bias: torch.Tensor,  # [Hkv * B, 1, L]: 0 where the row attends, -inf elsewhere
    scale: float,
) -> torch.Tensor:
    """Attention of one query token per row as two batched matmuls over (KV head, row), the query heads of a group
    sharing their KV head (GQA); for single-token queries this is several times faster than SDPA on CPU. The mask
    comes as an additive bias that the first matmul adds as it scales, which saves a masking pass per layer (unlike
    masked_fill it would turn an infinite score at a padded position into NaN, which finite float32 K/V never give).
    Returns [B, H, D]."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads, length = key.shape[0], score_bias.shape[-1]
    group = num_heads // num_kv_heads
    grouped = query.view(batch, num_kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim)
    keys = key.view(num_kv_heads * batch, length, head_dim)  # [Hkv * B, L, D]
    scores = torch.baddbmm(score_bias, grouped, keys.transpose(1, 2), alpha=scale)  # [Hkv * B, G, L]
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(value.dtype)
    attended = torch.bmm(probs, value.view(num_kv_heads * batch, length, head_dim))  # [Hkv * B, G, D]
    return attended.view(num_kv_heads, batch, group, head_dim).transpose(0, 1).reshape(batch, num_heads, head_dim)


def paged_flash_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H, N, D]
    key: torch.Tensor,  # [1, Hkv, N, D]
    value: torch.Tensor,  # [1, Hkv, N, D]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    paged_step: PagedStep,
    kv_pool: KVPool,
    **_: object,
) -> tuple[torch.Tensor, None]:
    from flash_attn import flash_attn_varlen_func

    kv_pool.write(module.layer_idx, paged_step.slot_mapping, key[0], value[0])
    k_cache, v_cache = kv_pool.layer(module.layer_idx)  # [blocks, block_size, Hkv, D]
    meta = paged_step.flash
    output = flash_attn_varlen_func(
        query[0].transpose(0, 1),  # [N, H, D]
        k_cache,
        v_cache,
        cu_seqlens_q=meta.cu_seqlens_q,
        cu_seqlens_k=meta.cu_seqlens_k,
        max_seqlen_q=meta.max_seqlen_q,
        max_seqlen_k=meta.max_seqlen_k,
        softmax_scale=scaling,
        causal=True,
        block_table=meta.block_table,
    )
    return output[None], None  # [1, N, H, D]


def register_paged_attention() -> None:
    AttentionInterface.register(SDPA_BACKEND, paged_sdpa_attention)
    AttentionInterface.register(FLASH_BACKEND, paged_flash_attention)
