"""Our attention function for transformers' AttentionInterface: K/V into the pool's blocks, attention over them.

The model calls it once per layer with the packed sequence's query, key and value (after RoPE), with the layer's
variant (scaling, sliding_window, softcap, s_aux: worker/kernels/layer_variant.py), and with the step's `PagedStep`
and the `KVPool` as keyword arguments that the model passes through to attention.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

from worker.engine.attention.gather_attention import gathered_attention
from worker.engine.attention.kv_pool import KVPool
from worker.engine.attention.paged_step import PagedStep
from worker.engine.embedding.packed_attention import PackedInputs, packed_attention
from worker.kernels.layer_variant import LayerVariant

# Neither name may contain "sdpa" or "flash_attention": transformers would then hold the model to the support flags
# of its own SDPA or flash-attn path (Gemma 2 has no SDPA path), which have nothing to do with ours.
PAGED_BACKEND = "steerbatch_paged"
FLASH_BACKEND = "steerbatch_paged_flash"


def paged_attention(
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
    packed_inputs: PackedInputs | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if packed_inputs is not None:  # an embedding forward: whole inputs, nothing read from or kept in the pool
        variant = LayerVariant(scale, sliding_window, softcap, s_aux)
        return packed_attention(query, key, value, variant, packed_inputs)[None], None
    if paged_step is None:  # under torch.compile (worker/engine/compiled_forward.py): the op finds the step itself
        output = torch.ops.steerbatch.paged_attention(
            query, key, value, kv_cache, module.layer_idx, scale, sliding_window or 0, softcap or 0.0, s_aux
        )
    else:
        variant = LayerVariant(scale, sliding_window, softcap, s_aux)
        output = paged_attention_at(module.layer_idx, query, key, value, variant, paged_step, kv_pool)
    return output[None], None  # [1, N, H, D]


def paged_attention_at(
    layer_idx: int,
    query: torch.Tensor,  # [1, H, N, D]
    key: torch.Tensor,  # [1, Hkv, N, D]
    value: torch.Tensor,  # [1, Hkv, N, D]
    variant: LayerVariant,
    paged_step: PagedStep,
    kv_pool: KVPool,
) -> torch.Tensor:
    """[N, H, D], a new tensor: layer `layer_idx`'s attention for every token of the step, after writing their
    K/V into the pool."""
    kv_pool.check_window(layer_idx, variant.sliding_window)
    if paged_step.triton is not None:  # the Triton kernels: every row over its blocks in place, two launches
        return paged_step.triton(layer_idx, query, key, value, variant, kv_pool)
    table = paged_step.decode_table
    if table is not None and table.kernel_step is not None:  # most steps: every token a decode row, one call
        return table.kernel_step(layer_idx, query, key, value, variant)
    queries = query[0].transpose(0, 1)  # [N, H, D]
    kv_pool.write(layer_idx, paged_step.slot_mapping, key[0], value[0])
    # contiguous whatever the queries' strides (gpt-oss hands them heads-major): what the compiled op declares
    output = torch.empty(queries.shape, dtype=queries.dtype, device=queries.device)
    if table is not None and kv_pool.decode_kernel is not None:  # decode rows among prefill chunks
        k_cache, v_cache = kv_pool.layer(layer_idx)
        rows = queries.index_select(0, table.token_index)
        codes = None if kv_pool.kernel_codes is None else kv_pool.kernel_codes[layer_idx]
        output[table.token_index] = kv_pool.decode_kernel.attention(
            rows, k_cache, v_cache, table.block_tables, table.context_lens, table.max_len, variant, codes
        )
    if paged_step.gathered:
        gathered = paged_step.gathered[variant.sliding_window]
        gathered_attention(layer_idx, queries, key, value, variant, gathered, kv_pool, output)
    return output


def paged_flash_attention(
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
    packed_inputs: PackedInputs | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **_: object,
) -> tuple[torch.Tensor, None]:
    """flash-attn's varlen kernel over the paged K/V: its window_size=(window - 1, 0) sees the same keys as HF's
    sliding mask, and it soft-caps; it has no sinks, which the load refuses on this backend. An embedding forward
    (`packed_inputs`) attends as on the other backends."""
    if packed_inputs is not None:
        variant = {"sliding_window": sliding_window, "softcap": softcap, "s_aux": s_aux}
        return paged_attention(module, query, key, value, None, scaling, packed_inputs=packed_inputs, **variant)
    from flash_attn import flash_attn_varlen_func

    if s_aux is not None:
        raise ValueError("flash-attn's paged kernel has no attention sinks (s_aux)")
    kv_pool.check_window(module.layer_idx, sliding_window)
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
        window_size=(-1, -1) if sliding_window is None else (sliding_window - 1, 0),
        softcap=softcap or 0.0,
        block_table=meta.block_table,
    )
    return output[None], None  # [1, N, H, D]


def register_paged_attention() -> None:
    AttentionInterface.register(PAGED_BACKEND, paged_attention)
    AttentionInterface.register(FLASH_BACKEND, paged_flash_attention)
