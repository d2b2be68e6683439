"""Our attention function for transformers' AttentionInterface: K/V into the pool's blocks, attention over them.

The model calls it once per layer with the packed sequence's query, key and value (after RoPE), and with the step's
`PagedStep` and the `KVPool` as keyword arguments that the model passes through to attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from worker.kv_pool import KVPool
from worker.paged_step import PagedStep

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
    paged_step: PagedStep,
    kv_pool: KVPool,
    **_: object,
) -> tuple[torch.Tensor, None]:
    k_cache, v_cache = kv_pool.layer(module.layer_idx)  # [slots, Hkv, D]
    k_cache.index_copy_(0, paged_step.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, paged_step.slot_mapping, value[0].transpose(0, 1))
    queries = query[0].transpose(0, 1)  # [N, H, D]
    output = torch.empty_like(queries)
    if (decode := paged_step.decode) is not None:
        q = queries[decode.token_index].unsqueeze(2)  # [Bd, H, 1, D]
        k = k_cache[decode.context_slots].transpose(1, 2)  # [Bd, Hkv, L, D]
        v = v_cache[decode.context_slots].transpose(1, 2)
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=decode.context_mask, scale=scaling, enable_gqa=True
        )
        output[decode.token_index] = attended.squeeze(2)
    for chunk in paged_step.prefills:
        q = queries[chunk.tokens].transpose(0, 1)[None]  # [1, H, n, D]
        if chunk.is_first:
            k, v = key[:, :, chunk.tokens], value[:, :, chunk.tokens]  # [1, Hkv, n, D]
        else:
            k = k_cache[chunk.context_slots].transpose(0, 1)[None]  # [1, Hkv, end, D]
            v = v_cache[chunk.context_slots].transpose(0, 1)[None]
        attended = F.scaled_dot_product_attention(
            q, k, v, attn_mask=chunk.causal_mask, is_causal=chunk.is_first, scale=scaling, enable_gqa=True
        )
        output[chunk.tokens] = attended[0].transpose(0, 1)
    return output[None], None  # [1, N, H, D]


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

    k_cache, v_cache = kv_pool.layer(module.layer_idx)  # [slots, Hkv, D]
    k_cache.index_copy_(0, paged_step.slot_mapping, key[0].transpose(0, 1))
    v_cache.index_copy_(0, paged_step.slot_mapping, value[0].transpose(0, 1))
    paged_shape = (kv_pool.num_blocks, kv_pool.block_size, *k_cache.shape[1:])  # [blocks, block_size, Hkv, D]
    meta = paged_step.flash
    output = flash_attn_varlen_func(
        query[0].transpose(0, 1),  # [N, H, D]
        k_cache.view(paged_shape),
        v_cache.view(paged_shape),
        cu_seqlens_q=meta.cu_seqlens_q,
        cu_seqlens_k=meta.cu_seqlens_k,
        max_seqlen_q=meta.max_seqlen_q,
        max_seqlen_k=meta.max_seqlen_k,
        softmax_scale=scaling,
        causal=True,
        block_table=meta.block_table,
    )
    return output[None], None  # [1, N, H, D]


def is_flash_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def register_paged_attention() -> None:
    AttentionInterface.register(SDPA_BACKEND, paged_sdpa_attention)
    AttentionInterface.register(FLASH_BACKEND, paged_flash_attention)
