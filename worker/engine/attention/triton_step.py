"""One step's attention through the Triton kernels: every decode row in one paged-decode launch, every other chunk
(prompt chunks, speculative verify chunks) in one paged-prefill launch, both over the pool's blocks in place.

Imported only when ATTENTION_BACKEND is triton, so that workers without the triton package never load it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from scheduler.batch import ScheduledChunk
from worker.engine.attention.block_tables import padded_block_tables
from worker.engine.attention.kv_pool import KVPool
from worker.kernels.layer_variant import LayerVariant
from worker.kernels.triton_decode import num_decode_splits, paged_decode
from worker.kernels.triton_prefill import paged_prefill


@dataclass(frozen=True)
class TritonDecodeRows:
    token_index: torch.Tensor  # [B] int32: each row's token in the packed step
    block_tables: torch.Tensor  # [B, W] int32, padded with block 0
    context_lens: torch.Tensor  # [B] int32: tokens each row attends to, its new one included
    num_splits: int  # parts each row's context is cut into (split-K), a power of two


@dataclass(frozen=True)
class TritonPrefillChunks:
    query_starts: torch.Tensor  # [R] int32: each chunk's first token in the packed step
    query_lens: torch.Tensor  # [R] int32
    context_starts: torch.Tensor  # [R] int32: the chunk's first token's position in its request
    block_tables: torch.Tensor  # [R, W] int32, padded with block 0
    max_query_len: int


@dataclass(frozen=True)
class TritonStep:
    slot_mapping: torch.Tensor  # [N] pool slot of each new token
    decode: TritonDecodeRows | None
    prefill: TritonPrefillChunks | None

    def __call__(
        self,
        layer_idx: int,
        query: torch.Tensor,  # [1, H, N, D]
        key: torch.Tensor,  # [1, Hkv, N, D]
        value: torch.Tensor,  # [1, Hkv, N, D]
        variant: LayerVariant,
        kv_pool: KVPool,
    ) -> torch.Tensor:
        """[N, H, D]: layer `layer_idx`'s attention for every token of the step, after writing their K/V into the
        pool (the prefill kernel reads a chunk's own K/V from there)."""
        kv_pool.write(layer_idx, self.slot_mapping, key[0], value[0])
        k_cache, v_cache = kv_pool.layer(layer_idx)
        queries = query[0].transpose(0, 1)  # [N, H, D], a view: the kernels read through its strides
        output = torch.empty(queries.shape, dtype=queries.dtype, device=queries.device)
        is_transposed = kv_pool.keys_transposed
        scales = kv_pool.layer_scales(layer_idx) if kv_pool.kv_dtype.is_quantized else None
        if self.decode is not None:
            rows = self.decode
            paged_decode(
                queries, k_cache, v_cache, rows.block_tables, rows.context_lens, rows.token_index, output, variant,
                rows.num_splits, is_transposed, kv_pool.kv_dtype, scales,
            )  # fmt: skip
        if self.prefill is not None:
            chunks = self.prefill
            paged_prefill(
                queries, k_cache, v_cache, chunks.block_tables, chunks.query_starts, chunks.query_lens,
                chunks.context_starts, chunks.max_query_len, output, variant, is_transposed, kv_pool.kv_dtype, scales,
            )  # fmt: skip
        return output


def build_triton_step(
    chunks: list[ScheduledChunk], slot_mapping: torch.Tensor, kv_pool: KVPool, device: torch.device
) -> TritonStep:
    """The step's chunks as the kernels take them: decode rows apart from everything else."""
    decodes: list[ScheduledChunk] = []
    others: list[ScheduledChunk] = []
    decode_tokens: list[int] = []  # where each chunk's first token lies in the packed step
    other_tokens: list[int] = []
    num_tokens = 0
    for chunk in chunks:
        if chunk.is_decode:
            decodes.append(chunk)
            decode_tokens.append(num_tokens)
        else:
            others.append(chunk)
            other_tokens.append(num_tokens)
        num_tokens += chunk.num_tokens
    decode = _decode_rows(decodes, decode_tokens, kv_pool, device) if decodes else None
    prefill = _prefill_chunks(others, other_tokens, kv_pool, device) if others else None
    return TritonStep(slot_mapping, decode, prefill)


def _decode_rows(
    chunks: list[ScheduledChunk], first_tokens: list[int], kv_pool: KVPool, device: torch.device
) -> TritonDecodeRows:
    max_len = max(chunk.end for chunk in chunks)
    return TritonDecodeRows(
        token_index=_int32(first_tokens, device),
        block_tables=_block_tables(chunks, kv_pool, device),
        context_lens=_int32([chunk.end for chunk in chunks], device),
        num_splits=num_decode_splits(len(chunks), kv_pool.num_kv_heads, max_len, num_sms(device)),
    )


def _prefill_chunks(
    chunks: list[ScheduledChunk], first_tokens: list[int], kv_pool: KVPool, device: torch.device
) -> TritonPrefillChunks:
    return TritonPrefillChunks(
        query_starts=_int32(first_tokens, device),
        query_lens=_int32([chunk.num_tokens for chunk in chunks], device),
        context_starts=_int32([chunk.start for chunk in chunks], device),
        block_tables=_block_tables(chunks, kv_pool, device),
        max_query_len=max(chunk.num_tokens for chunk in chunks),
    )


def _int32(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)


def _block_tables(chunks: list[ScheduledChunk], kv_pool: KVPool, device: torch.device) -> torch.Tensor:
    """[R, W] int32 on `device`; the kernels read every listed block unchecked, so a block past the pool fails here."""
    tables = padded_block_tables(chunks)
    if int(tables.max()) >= kv_pool.num_blocks:
        raise IndexError(f"a block table lists a block outside the pool's {kv_pool.num_blocks}")
    return tables.to(device=device, dtype=torch.int32, non_blocking=True)


@functools.cache
def num_sms(device: torch.device) -> int:
    """The programs a launch runs at once: the GPU's multiprocessors; one under the CPU interpreter, which runs them
    one after another (so splitting a row would only add work there)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
