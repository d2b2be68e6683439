"""The tensors one engine step needs: packed tokens, where their K/V go, and what each row attends to.

All scheduled chunks are packed into one sequence of N tokens. Decode rows (one new token each) attend together:
through the CPU decode kernel over their block tables when the pool has it, else in one batched call per length
bucket over their gathered blocks. Prefill chunks attend one by one with a causal mask offset by the tokens
already in their blocks. What the gathering path reads depends on the sliding window, so it is built once per window
the model's layers use (worker/engine/attention/gather_step.py). The Triton and flash-attn backends take their own
metadata instead and attend to every chunk in one or two kernel launches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scheduler.batch import Batch, ScheduledChunk
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.block_tables import int64_tensor, padded_block_tables
from worker.engine.attention.gather_step import GatherRows, build_gather_rows
from worker.engine.attention.kv_pool import KVPool
from worker.kernels.cpu_decode_kernel import DecodeStep

if TYPE_CHECKING:
    from worker.engine.attention.triton_step import TritonStep


@dataclass(frozen=True)
class DecodeTable:
    """Every decode row at once, for the CPU decode kernel: it reads each row's blocks where they lie."""

    token_index: torch.Tensor  # [B] positions of the decode tokens in the packed sequence
    block_tables: torch.Tensor  # [B, W] int64, padded with block 0 past each row's blocks
    context_lens: torch.Tensor  # [B] int64
    max_len: int
    kernel_step: DecodeStep | None  # when every token of the step is a decode row: stores each layer's K/V, attends


@dataclass(frozen=True)
class FlashMetadata:
    cu_seqlens_q: torch.Tensor  # [R + 1] int32
    cu_seqlens_k: torch.Tensor  # [R + 1] int32
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor  # [R, max_blocks] int32


@dataclass(frozen=True)
class PagedStep:
    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    slot_mapping: torch.Tensor  # [N] pool slot of each new token
    logits_indices: torch.Tensor  # [S] the last token of each sampling chunk
    token_rows: torch.Tensor  # [N] the chunk each token belongs to
    gathered: dict[int | None, GatherRows]  # per sliding window of the model's layers: what the SDPA path gathers
    decode_table: DecodeTable | None  # for the CPU decode kernel, which attends the decode rows instead
    flash: FlashMetadata | None
    triton: TritonStep | None  # the Triton kernels' metadata, instead of gathered and decode_table


def build_paged_step(batch: Batch, kv_pool: KVPool, device: torch.device, backend: AttentionBackend) -> PagedStep:
    chunks, block_size = batch.chunks, kv_pool.block_size
    for_flash, for_triton = backend is AttentionBackend.FLASH_ATTN, backend is AttentionBackend.TRITON
    is_gathering = not (for_flash or for_triton)  # the SDPA path's metadata, for the C kernel's pool too
    has_kernel = kv_pool.decode_kernel is not None  # never on a flash pool: its layout is not heads-major
    input_ids, positions, slots, rows, logits_indices = [], [], [], [], []
    decode_chunks: list[ScheduledChunk] = []  # the decode rows, and where their tokens lie in the step
    decode_token_index: list[int] = []
    for row, chunk in enumerate(chunks):
        request, start, num_tokens = chunk.request, chunk.start, chunk.num_tokens
        table = request.block_table  # too short for the chunk: IndexError here, before the kernel could write past it
        if num_tokens == 1:  # most rows of most steps: no ranges, no token list copies
            if chunk.is_decode:
                decode_chunks.append(chunk)
                decode_token_index.append(len(input_ids))
            input_ids.append(request.token_at(start))
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
            rows.append(row)
        else:
            span = range(start, start + num_tokens)
            input_ids.extend(chunk.token_ids)
            positions.extend(span)
            slots.extend(table[position // block_size] * block_size + position % block_size for position in span)
            rows.extend([row] * num_tokens)
        if chunk.is_sampling:
            logits_indices.extend(range(len(input_ids) - chunk.num_logits, len(input_ids)))

    # The CPU kernel reads and writes blocks without checking: a block past the pool fails here.
    if slots and max(slots) >= kv_pool.num_blocks * block_size:
        raise IndexError(f"a KV slot is outside the pool's {kv_pool.num_blocks * block_size}")

    slot_mapping = int64_tensor(slots, device)
    decode_table = None
    if has_kernel and decode_chunks:
        decode_table = _decode_table(decode_chunks, decode_token_index, len(input_ids), kv_pool, slot_mapping, device)
    has_prefill = len(decode_chunks) < len(chunks)
    gathered = {}
    if is_gathering and (has_prefill or not has_kernel):
        has_decodes = not has_kernel and bool(decode_chunks)
        gathered = {
            window: build_gather_rows(chunks, window, kv_pool, device, has_decodes) for window in kv_pool.windows
        }
    return PagedStep(
        input_ids=int64_tensor(input_ids, device)[None],
        position_ids=int64_tensor(positions, device)[None],
        slot_mapping=slot_mapping,
        logits_indices=int64_tensor(logits_indices, device),
        token_rows=int64_tensor(rows, device),
        gathered=gathered,
        decode_table=decode_table,
        flash=_flash_metadata(chunks, device) if for_flash else None,
        triton=_triton_step(chunks, slot_mapping, kv_pool, device) if for_triton else None,
    )


def _decode_table(
    chunks: list[ScheduledChunk],
    token_index: list[int],
    num_step_tokens: int,
    kv_pool: KVPool,
    slot_mapping: torch.Tensor,
    device: torch.device,
) -> DecodeTable:
    """The decode rows `chunks`, whose tokens lie at `token_index` of the step's `num_step_tokens`."""
    lens = [chunk.start + 1 for chunk in chunks]
    block_tables, context_lens = padded_block_tables(chunks), int64_tensor(lens, torch.device("cpu"))
    if int(block_tables.max()) >= kv_pool.num_blocks:  # the kernel reads every listed block without checking
        raise IndexError(f"a block table lists a block outside the pool's {kv_pool.num_blocks}")
    kernel_step = None
    if len(lens) == num_step_tokens and kv_pool.decode_kernel is not None:  # every token a decode row, in order
        kernel_step = kv_pool.decode_kernel.bind_decode_step(
            kv_pool.layers, slot_mapping, block_tables, context_lens, max(lens), kv_pool.kernel_codes
        )
    return DecodeTable(
        token_index=int64_tensor(token_index, device),
        block_tables=block_tables,
        context_lens=context_lens,
        max_len=max(lens),
        kernel_step=kernel_step,
    )


def _flash_metadata(chunks: list[ScheduledChunk], device: torch.device) -> FlashMetadata:
    cu_q, cu_k = [0], [0]
    for chunk in chunks:
        cu_q.append(cu_q[-1] + chunk.num_tokens)
        cu_k.append(cu_k[-1] + chunk.end)
    return FlashMetadata(
        cu_seqlens_q=int64_tensor(cu_q, device).int(),
        cu_seqlens_k=int64_tensor(cu_k, device).int(),
        max_seqlen_q=max(chunk.num_tokens for chunk in chunks),
        max_seqlen_k=max(chunk.end for chunk in chunks),
        block_table=padded_block_tables(chunks).to(device=device, dtype=torch.int32, non_blocking=True),
    )


def _triton_step(
    chunks: list[ScheduledChunk], slot_mapping: torch.Tensor, kv_pool: KVPool, device: torch.device
) -> TritonStep:
    from worker.engine.attention.triton_step import build_triton_step  # imports triton: only on workers that run it

    return build_triton_step(chunks, slot_mapping, kv_pool, device)
