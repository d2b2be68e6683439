"""The tensors one engine step needs: packed tokens, where their K/V go, and what each row attends to.

All scheduled chunks are packed into one sequence of N tokens. Decode rows (one new token each) attend together:
through the CPU decode kernel over their block tables when the pool has it, else in one batched call per length
bucket over their gathered blocks. Prefill chunks attend one by one with a causal mask offset by the tokens
already in their blocks. The Triton and flash-attn backends take their own metadata instead and attend to every
chunk in one or two kernel launches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scheduler.batch import Batch, ScheduledChunk
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.block_tables import int64_tensor, padded_block_tables
from worker.engine.attention.kv_pool import KVPool
from worker.kernels.cpu_decode_kernel import DecodeStep

if TYPE_CHECKING:
    from worker.engine.attention.triton_step import TritonStep

GROUP_GROWTH = 1.5
MIN_GROUP_SIZE = 4  # below this, another attention call costs more than the padding it saves


@dataclass(frozen=True)
class DecodeRows:
    token_index: torch.Tensor  # [Bd] positions of the decode tokens in the packed sequence
    block_ids: torch.Tensor  # [Bd * W] each row's first W blocks, padded with block 0
    score_bias: torch.Tensor  # [Hkv * Bd, 1, W * block_size]: 0 where a row attends, -inf elsewhere


@dataclass(frozen=True)
class DecodeTable:
    """Every decode row at once, for the CPU decode kernel: it reads each row's blocks where they lie."""

    token_index: torch.Tensor  # [B] positions of the decode tokens in the packed sequence
    block_tables: torch.Tensor  # [B, W] int64, padded with block 0 past each row's blocks
    context_lens: torch.Tensor  # [B] int64
    max_len: int
    kernel_step: DecodeStep | None  # when every token of the step is a decode row: stores each layer's K/V, attends


@dataclass(frozen=True)
class PrefillChunk:
    tokens: slice  # the chunk's span of the packed sequence
    is_first: bool  # nothing computed before it: attend over its own new K/V, causally
    block_ids: torch.Tensor  # [nb] the blocks holding tokens 0..end of the request
    end: int  # the request's tokens up to the chunk's last
    causal_mask: torch.Tensor | None  # [n, end] True where a query attends; None when is_first


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
    decode_groups: list[DecodeRows]  # decode rows bucketed by context length, so little of the gather is padding
    decode_table: DecodeTable | None  # instead of decode_groups when the pool has the CPU decode kernel
    prefills: list[PrefillChunk]
    flash: FlashMetadata | None
    triton: TritonStep | None  # the Triton kernels' metadata, instead of decode_groups, decode_table and prefills


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
    return PagedStep(
        input_ids=int64_tensor(input_ids, device)[None],
        position_ids=int64_tensor(positions, device)[None],
        slot_mapping=slot_mapping,
        logits_indices=int64_tensor(logits_indices, device),
        token_rows=int64_tensor(rows, device),
        decode_groups=_decode_groups(chunks, kv_pool, device) if is_gathering and not has_kernel else [],
        decode_table=decode_table,
        prefills=_prefill_chunks(chunks, block_size, device) if has_prefill and is_gathering else [],
        flash=_flash_metadata(chunks, device) if for_flash else None,
        triton=_triton_step(chunks, slot_mapping, kv_pool, device) if for_triton else None,
    )


def _decode_groups(chunks: list[ScheduledChunk], kv_pool: KVPool, device: torch.device) -> list[DecodeRows]:
    """Decode rows sorted by context length and cut where a row needs GROUP_GROWTH x the blocks of its group's
    shortest, so each group's gather pads every row to at most that much more than it holds."""
    rows = sorted((row for row, chunk in enumerate(chunks) if chunk.is_decode), key=lambda row: chunks[row].end)
    first_token = [0]
    for chunk in chunks:
        first_token.append(first_token[-1] + chunk.num_tokens)
    groups: list[list[int]] = []
    for row in rows:
        if groups and (len(groups[-1]) < MIN_GROUP_SIZE or chunks[row].end <= GROUP_GROWTH * chunks[groups[-1][0]].end):
            groups[-1].append(row)
        else:
            groups.append([row])
    return [_decode_rows(chunks, group, first_token, kv_pool, device) for group in groups]


def _decode_rows(
    chunks: list[ScheduledChunk], rows: list[int], first_token: list[int], kv_pool: KVPool, device: torch.device
) -> DecodeRows:
    block_size = kv_pool.block_size
    context_lens = [chunks[row].end for row in rows]
    width = -(-max(context_lens) // block_size)  # blocks per row
    block_ids = []
    for row in rows:
        table = chunks[row].request.block_table[:width]
        block_ids.extend(table + [0] * (width - len(table)))
    is_padding = torch.arange(width * block_size)[None, :] >= torch.tensor(context_lens)[:, None]  # [Bd, W * bs]
    bias = torch.zeros(is_padding.shape, dtype=kv_pool.dtype).masked_fill_(is_padding, float("-inf"))
    return DecodeRows(
        token_index=int64_tensor([first_token[row] for row in rows], device),
        block_ids=int64_tensor(block_ids, device),
        score_bias=bias.repeat(kv_pool.num_kv_heads, 1)[:, None, :].to(device, non_blocking=True),  # KV head major
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
            kv_pool.layers, slot_mapping, block_tables, context_lens, max(lens)
        )
    return DecodeTable(
        token_index=int64_tensor(token_index, device),
        block_tables=block_tables,
        context_lens=context_lens,
        max_len=max(lens),
        kernel_step=kernel_step,
    )


def _prefill_chunks(chunks: list[ScheduledChunk], block_size: int, device: torch.device) -> list[PrefillChunk]:
    prefills, token_start = [], 0
    for chunk in chunks:
        if not chunk.is_decode:
            is_first = chunk.start == 0
            queries = torch.arange(chunk.start, chunk.end, device=device)[:, None]  # [n, 1]
            keys = torch.arange(chunk.end, device=device)[None, :]  # [1, end]
            num_blocks = -(-chunk.end // block_size)
            prefills.append(
                PrefillChunk(
                    tokens=slice(token_start, token_start + chunk.num_tokens),
                    is_first=is_first,
                    block_ids=int64_tensor(chunk.request.block_table[:num_blocks], device),
                    end=chunk.end,
                    causal_mask=None if is_first else keys <= queries,
                )
            )
        token_start += chunk.num_tokens
    return prefills


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
