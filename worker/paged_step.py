"""The tensors one engine step needs: packed tokens, where their K/V go, and what each row attends to.

All scheduled chunks are packed into one sequence of N tokens. Decode rows (one new token each) attend together in
one batched call over their gathered blocks; prefill chunks attend one by one with a causal mask offset by the
tokens already in their blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scheduler.batch import Batch, ScheduledChunk


@dataclass(frozen=True)
class DecodeRows:
    token_index: torch.Tensor  # [Bd] positions of the decode tokens in the packed sequence
    context_slots: torch.Tensor  # [Bd, L] pool slots of each row's context, padded
    context_mask: torch.Tensor  # [Bd, 1, 1, L] True where a row attends


@dataclass(frozen=True)
class PrefillChunk:
    tokens: slice  # the chunk's span of the packed sequence
    is_first: bool  # nothing computed before it: attend over its own new K/V, causally
    context_slots: torch.Tensor  # [end] pool slots of tokens 0..end of the request
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
    decode: DecodeRows | None
    prefills: list[PrefillChunk]
    flash: FlashMetadata | None


def build_paged_step(batch: Batch, block_size: int, device: torch.device, for_flash: bool) -> PagedStep:
    chunks = batch.chunks
    input_ids, positions, slots, rows, logits_indices = [], [], [], [], []
    for row, chunk in enumerate(chunks):
        if chunk.is_sampling:
            logits_indices.append(len(input_ids) + chunk.num_tokens - 1)
        input_ids.extend(chunk.token_ids)
        span = range(chunk.start, chunk.end)
        positions.extend(span)
        slots.extend(_slot(chunk, position, block_size) for position in span)
        rows.extend([row] * chunk.num_tokens)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)

    block_tables = _block_tables(chunks).to(device, non_blocking=True)
    return PagedStep(
        input_ids=tensor(input_ids)[None],
        position_ids=tensor(positions)[None],
        slot_mapping=tensor(slots),
        logits_indices=tensor(logits_indices),
        token_rows=tensor(rows),
        decode=None if for_flash else _decode_rows(chunks, block_tables, block_size, device),
        prefills=[] if for_flash else _prefill_chunks(chunks, block_tables, block_size, device),
        flash=_flash_metadata(chunks, block_tables, device) if for_flash else None,
    )


def _slot(chunk: ScheduledChunk, position: int, block_size: int) -> int:
    return chunk.request.block_table[position // block_size] * block_size + position % block_size


def _block_tables(chunks: list[ScheduledChunk]) -> torch.Tensor:
    """[R, max_blocks], padded with block 0 (masked out wherever it pads)."""
    width = max(len(chunk.request.block_table) for chunk in chunks)
    return torch.tensor([c.request.block_table + [0] * (width - len(c.request.block_table)) for c in chunks])


def _context_slots(block_tables: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """[R, length] the pool slots of positions 0..length of each row."""
    positions = torch.arange(length, device=block_tables.device)
    return block_tables[:, positions // block_size] * block_size + positions % block_size


def _decode_rows(
    chunks: list[ScheduledChunk], block_tables: torch.Tensor, block_size: int, device: torch.device
) -> DecodeRows | None:
    rows = [row for row, chunk in enumerate(chunks) if chunk.is_decode]
    if not rows:
        return None
    first_token = [0]
    for chunk in chunks:
        first_token.append(first_token[-1] + chunk.num_tokens)
    context_lens = torch.tensor([chunks[row].end for row in rows], device=device)  # [Bd]
    length = int(context_lens.max())
    index = torch.tensor(rows, device=device)
    mask = torch.arange(length, device=device)[None, :] < context_lens[:, None]  # [Bd, L]
    return DecodeRows(
        token_index=torch.tensor([first_token[row] for row in rows], device=device),
        context_slots=_context_slots(block_tables[index], length, block_size),
        context_mask=mask[:, None, None, :],
    )


def _prefill_chunks(
    chunks: list[ScheduledChunk], block_tables: torch.Tensor, block_size: int, device: torch.device
) -> list[PrefillChunk]:
    prefills, token_start = [], 0
    for row, chunk in enumerate(chunks):
        if not chunk.is_decode:
            is_first = chunk.start == 0
            queries = torch.arange(chunk.start, chunk.end, device=device)[:, None]  # [n, 1]
            keys = torch.arange(chunk.end, device=device)[None, :]  # [1, end]
            prefills.append(
                PrefillChunk(
                    tokens=slice(token_start, token_start + chunk.num_tokens),
                    is_first=is_first,
                    context_slots=_context_slots(block_tables[row : row + 1], chunk.end, block_size)[0],
                    causal_mask=None if is_first else keys <= queries,
                )
            )
        token_start += chunk.num_tokens
    return prefills


def _flash_metadata(chunks: list[ScheduledChunk], block_tables: torch.Tensor, device: torch.device) -> FlashMetadata:
    cu_q, cu_k = [0], [0]
    for chunk in chunks:
        cu_q.append(cu_q[-1] + chunk.num_tokens)
        cu_k.append(cu_k[-1] + chunk.end)
    return FlashMetadata(
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
        cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=device),
        max_seqlen_q=max(chunk.num_tokens for chunk in chunks),
        max_seqlen_k=max(chunk.end for chunk in chunks),
        block_table=block_tables.to(torch.int32),
    )
