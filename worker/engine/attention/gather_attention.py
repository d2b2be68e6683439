"""The gathering path's attention: each row's blocks gathered from the pool, then batched matmuls (decode rows) or
SDPA (prefill chunks), with the layer's variant applied to the scores.

SDPA has no soft-cap and no sinks, so a prefill chunk of a layer with either attends through the same matmuls and
softmax written out (`variant_attention`), as HF's eager attention computes them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worker.engine.attention.gather_step import GatherRows
from worker.engine.attention.kv_pool import KVPool
from worker.kernels.layer_variant import LayerVariant


def gathered_attention(
    layer_idx: int,
    queries: torch.Tensor,  # [N, H, D]
    key: torch.Tensor,  # [1, Hkv, N, D], the step's new keys, already in the pool
    value: torch.Tensor,  # [1, Hkv, N, D]
    variant: LayerVariant,
    rows: GatherRows,
    kv_pool: KVPool,
    output: torch.Tensor,  # [N, H, D]: the rows' attention is written at their tokens
) -> None:
    k_cache, v_cache = kv_pool.layer(layer_idx)  # [Hkv, blocks, block_size, D]; keys maybe [Hkv, blocks, D, bs]
    for decode in rows.decode_groups:
        q = queries.index_select(0, decode.token_index)  # [Bd, H, D]
        k = gather_blocks(k_cache, decode.block_ids)  # [Hkv, Bd * W * block_size, D]
        v = gather_blocks(v_cache, decode.block_ids)
        k, v = kv_pool.dequantized(layer_idx, k, v, decode.block_ids)
        output[decode.token_index] = decode_attention(q, k, v, decode.score_bias, variant)
    for chunk in rows.prefills:
        q = queries[chunk.tokens].transpose(0, 1)[None]  # [1, H, n, D]
        # a quantized pool's first chunk attends over its stored codes too, as every later read of them does
        if chunk.is_first and not kv_pool.kv_dtype.is_quantized:
            k, v = key[:, :, chunk.tokens], value[:, :, chunk.tokens]  # [1, Hkv, n, D]
        else:
            length = chunk.end - chunk.key_start
            k = gather_keys(k_cache, chunk.block_ids, kv_pool.keys_transposed)  # [Hkv, nb * block_size, D]
            v = gather_blocks(v_cache, chunk.block_ids)
            k, v = kv_pool.dequantized(layer_idx, k, v, chunk.block_ids)
            k, v = k[None, :, :length], v[None, :, :length]  # [1, Hkv, len, D]
        output[chunk.tokens] = prefill_attention(q, k, v, chunk.mask, variant)[0].transpose(0, 1)


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
    variant: LayerVariant,
) -> torch.Tensor:
    """Attention of one query token per row as two batched matmuls over (KV head, row), the query heads of a group
    sharing their KV head (GQA); for single-token queries this is several times faster than SDPA on CPU. The mask
    comes as an additive bias that the first matmul adds as it scales, which saves a masking pass per layer (unlike
    masked_fill it would turn an infinite score at a padded position into NaN, which finite float32 K/V never give);
    a soft-capped layer adds it after the cap. Returns [B, H, D]."""
    batch, num_heads, head_dim = query.shape
    num_kv_heads, length = key.shape[0], score_bias.shape[-1]
    group = num_heads // num_kv_heads
    grouped = query.view(batch, num_kv_heads, group, head_dim).transpose(0, 1).reshape(-1, group, head_dim)
    keys = key.view(num_kv_heads * batch, length, head_dim)  # [Hkv * B, L, D]
    if variant.softcap is None:
        scores = torch.baddbmm(score_bias, grouped, keys.transpose(1, 2), alpha=variant.scale)  # [Hkv * B, G, L]
    else:
        scores = soft_capped(torch.bmm(grouped, keys.transpose(1, 2)) * variant.scale, variant.softcap) + score_bias
    sinks = None
    if variant.sinks is not None:  # head kvh * G + g's sink, for every row: [Hkv * B, G, 1]
        sinks = variant.sinks.view(num_kv_heads, 1, group, 1).expand(-1, batch, -1, -1).reshape(-1, group, 1)
    probs = softmax_with_sinks(scores, sinks).to(value.dtype)
    attended = torch.bmm(probs, value.view(num_kv_heads * batch, length, head_dim))  # [Hkv * B, G, D]
    return attended.view(num_kv_heads, batch, group, head_dim).transpose(0, 1).reshape(batch, num_heads, head_dim)


def prefill_attention(
    query: torch.Tensor,  # [1, H, n, D]
    key: torch.Tensor,  # [1, Hkv, L, D]
    value: torch.Tensor,  # [1, Hkv, L, D]
    mask: torch.Tensor | None,  # [n, L] True where a query attends; None: causal, L == n
    variant: LayerVariant,
) -> torch.Tensor:
    """[1, H, n, D]: SDPA, or its arithmetic written out for a layer with a soft-cap or sinks."""
    if variant.softcap is None and variant.sinks is None:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=mask is None, scale=variant.scale, enable_gqa=True
        )
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)  # [1, H, L, D]
    scores = query @ key.transpose(2, 3) * variant.scale  # [1, H, n, L]
    if variant.softcap is not None:
        scores = soft_capped(scores, variant.softcap)
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    sinks = None if variant.sinks is None else variant.sinks.view(1, -1, 1, 1).expand(-1, -1, scores.shape[2], -1)
    return softmax_with_sinks(scores, sinks).to(value.dtype) @ value


def soft_capped(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    """Gemma 2's attention-logit soft-cap: softcap * tanh(scores / softcap)."""
    return torch.tanh(scores / softcap) * softcap


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dimension in float32; `sinks` (scores' shape but 1 wide) join the softmax as keys whose
    weights are then dropped, as HF's gpt-oss eager attention computes them."""
    if sinks is None:
        return scores.softmax(dim=-1, dtype=torch.float32)
    combined = torch.cat([scores, sinks.to(scores.dtype)], dim=-1)
    return combined.softmax(dim=-1, dtype=torch.float32)[..., :-1]
