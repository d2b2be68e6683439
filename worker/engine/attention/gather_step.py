"""What the gathering SDPA path reads for one sliding window: the blocks each row attends to, and its mask.

Decode rows (one new token each) attend in one batched call per length bucket over their gathered blocks; prefill
chunks attend one by one. A row under a sliding window gathers only the blocks its window reaches, from the block of
its first visible key, and its mask hides the keys of that first block before the window. The C decode kernel, the
Triton kernels and flash-attn take the window as a parameter instead and need none of this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scheduler.batch import ScheduledChunk
from worker.engine.attention.block_tables import int64_tensor
from worker.engine.attention.kv_pool import KVPool

GROUP_GROWTH = 1.5
MIN_GROUP_SIZE = 4  # below this, another attention call costs more than the padding it saves


@dataclass(frozen=True)
class DecodeRows:
    token_index: torch.Tensor  # [Bd] positions of the decode tokens in the packed sequence
    block_ids: torch.Tensor  # [Bd * W] each row's W blocks from its window's first, padded with block 0
    score_bias: torch.Tensor  # [Hkv * Bd, 1, W * block_size]: 0 where a row attends, -inf elsewhere


@dataclass(frozen=True)
class PrefillChunk:
    tokens: slice  # the chunk's span of the packed sequence
    is_first: bool  # nothing computed before it: attend over its own new K/V
    block_ids: torch.Tensor  # [nb] the blocks holding the request's tokens key_start..end
    key_start: int  # the first key the chunk attends over (a block's first token, or 0 when is_first)
    end: int  # the request's tokens up to the chunk's last
    mask: torch.Tensor | None  # [n, end - key_start] True where a query attends; None: plain causal from token 0


@dataclass(frozen=True)
class GatherRows:
    """Every row of a step as the gathering path attends to it under one sliding window (None: no window)."""

    decode_groups: list[DecodeRows]  # decode rows bucketed by context length, so little of the gather is padding
    prefills: list[PrefillChunk]


def first_block(position: int, window: int | None, block_size: int) -> int:
    """The block holding the first key a query at `position` sees under `window`."""
    return 0 if window is None else max(0, position - window + 1) // block_size


def build_gather_rows(
    chunks: list[ScheduledChunk],
    window: int | None,
    kv_pool: KVPool,
    device: torch.device,
    has_decodes: bool,  # the decode rows attend here (not through the C kernel)
) -> GatherRows:
    return GatherRows(
        decode_groups=_decode_groups(chunks, window, kv_pool, device) if has_decodes else [],
        prefills=_prefill_chunks(chunks, window, kv_pool.block_size, device),
    )


def _decode_groups(
    chunks: list[ScheduledChunk], window: int | None, kv_pool: KVPool, device: torch.device
) -> list[DecodeRows]:
    """Decode rows sorted by the tokens they gather and cut where a row gathers GROUP_GROWTH x its group's
    shortest, so each group's gather pads every row to at most that much more than it holds."""
    block_size = kv_pool.block_size
    gathered = [chunk.end - first_block(chunk.start, window, block_size) * block_size for chunk in chunks]
    rows = sorted((row for row, chunk in enumerate(chunks) if chunk.is_decode), key=lambda row: gathered[row])
    first_token = [0]
    for chunk in chunks:
        first_token.append(first_token[-1] + chunk.num_tokens)
    groups: list[list[int]] = []
    for row in rows:
        if groups and (len(groups[-1]) < MIN_GROUP_SIZE or gathered[row] <= GROUP_GROWTH * gathered[groups[-1][0]]):
            groups[-1].append(row)
        else:
            groups.append([row])
    return [_decode_rows(chunks, group, first_token, window, kv_pool, device) for group in groups]


def _decode_rows(
    chunks: list[ScheduledChunk],
    rows: list[int],
    first_token: list[int],
    window: int | None,
    kv_pool: KVPool,
    device: torch.device,
) -> DecodeRows:
    block_size = kv_pool.block_size
    firsts = [first_block(chunks[row].start, window, block_size) for row in rows]
    ends = [chunks[row].end for row in rows]
    width = max(-(-end // block_size) - first for first, end in zip(firsts, ends, strict=True))  # blocks per row
    block_ids = []
    for row, first in zip(rows, firsts, strict=True):
        table = chunks[row].request.block_table[first : first + width]
        block_ids.extend(table + [0] * (width - len(table)))
    # key j of row b's gather is the request's token firsts[b] * block_size + j
    positions = torch.arange(width * block_size)[None, :] + torch.tensor(firsts)[:, None] * block_size
    ends_column = torch.tensor(ends)[:, None]
    is_hidden = positions >= ends_column  # [Bd, W * bs]
    if window is not None:
        is_hidden |= positions < ends_column - window
    bias = torch.zeros(is_hidden.shape, dtype=kv_pool.dtype).masked_fill_(is_hidden, float("-inf"))
    return DecodeRows(
        token_index=int64_tensor([first_token[row] for row in rows], device),
        block_ids=int64_tensor(block_ids, device),
        score_bias=bias.repeat(kv_pool.num_kv_heads, 1)[:, None, :].to(device, non_blocking=True),  # KV head major
    )


def _prefill_chunks(
    chunks: list[ScheduledChunk], window: int | None, block_size: int, device: torch.device
) -> list[PrefillChunk]:
    prefills, token_start = [], 0
    for chunk in chunks:
        if not chunk.is_decode:
            is_first = chunk.start == 0
            first = 0 if is_first else first_block(chunk.start, window, block_size)
            key_start = first * block_size
            num_blocks = -(-chunk.end // block_size)
            is_plain = is_first and (window is None or chunk.num_tokens <= window)
            prefills.append(
                PrefillChunk(
                    tokens=slice(token_start, token_start + chunk.num_tokens),
                    is_first=is_first,
                    block_ids=int64_tensor(chunk.request.block_table[first:num_blocks], device),
                    key_start=key_start,
                    end=chunk.end,
                    mask=None if is_plain else _mask(chunk, key_start, window, device),
                )
            )
        token_start += chunk.num_tokens
    return prefills


def _mask(chunk: ScheduledChunk, key_start: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[n, end - key_start]: True where a query of the chunk sees a key from `key_start` on."""
    queries = torch.arange(chunk.start, chunk.end, device=device)[:, None]  # [n, 1]
    keys = torch.arange(key_start, chunk.end, device=device)[None, :]  # [1, end - key_start]
    mask = keys <= queries
    if window is not None:
        mask &= keys > queries - window
    return mask
