"""The static tensors of a decode-only step that a captured CUDA graph reads, and the batch-size buckets it is
captured for.

A graph replays the kernels it recorded on the same device addresses, so every per-step input lives in a buffer
allocated once for the largest bucket: a step copies its rows in (two host-to-device copies) and fills the rows past
them, up to its bucket, with padding rows. A padding row is token 0 at position 0, writes its K/V into the pool's
scratch block, which no request ever holds, and attends only to that one token: it never reads or writes a real
block, and its logits are dropped.
"""

from __future__ import annotations

from array import array

import torch

from scheduler.batch import ScheduledChunk
from worker.engine.attention.kv_pool import KVPool
from worker.engine.attention.paged_step import PagedStep
from worker.engine.attention.triton_step import TritonDecodeRows, TritonStep

TOKEN, POSITION, SLOT, CONTEXT_LEN = range(4)  # the rows of DecodeBuffers.meta


def decode_buckets(max_num_seqs: int) -> list[int]:
    """The batch sizes graphs are captured for: powers of two below `max_num_seqs`, then `max_num_seqs`."""
    buckets, size = [], 1
    while size < max_num_seqs:
        buckets.append(size)
        size *= 2
    return [*buckets, max_num_seqs]


def bucket_for(num_rows: int, buckets: list[int]) -> int | None:
    """The smallest bucket holding `num_rows` rows; None when the largest is too small."""
    return next((bucket for bucket in buckets if bucket >= num_rows), None)


def is_graph_step(chunks: list[ScheduledChunk]) -> bool:
    """Every chunk a decode row that samples: one token, its logits kept (prefill and verify chunks run eagerly)."""
    return bool(chunks) and all(chunk.is_decode and chunk.is_sampling and not chunk.num_spec_tokens for chunk in chunks)


class DecodeBuffers:
    """The step inputs of up to `max_rows` decode rows, on the pool's device; each bucket's graph reads the first
    `bucket` rows of every buffer."""

    def __init__(self, kv_pool: KVPool, max_rows: int, max_blocks_per_row: int, device: torch.device) -> None:
        if kv_pool.scratch_block is None:
            raise ValueError("decode graphs need a KV pool with a scratch block for their padding rows")
        self._kv_pool = kv_pool
        self._scratch_slot = kv_pool.scratch_block * kv_pool.block_size
        self.max_rows = max_rows
        self.max_blocks_per_row = max_blocks_per_row
        self.meta = torch.zeros(4, max_rows, dtype=torch.int32, device=device)  # token, position, slot, context len
        self.block_tables = torch.zeros(max_rows, max_blocks_per_row, dtype=torch.int32, device=device)
        self.token_index = torch.arange(max_rows, dtype=torch.int32, device=device)  # row i is token i
        self.row_index = torch.arange(max_rows, dtype=torch.int64, device=device)  # logits of every row, in order

    def fits(self, chunks: list[ScheduledChunk]) -> bool:
        """Whether the rows fit the buffers: few enough, and no row's context wider than a block table row."""
        block_size = self._kv_pool.block_size
        return len(chunks) <= self.max_rows and all(
            -(-chunk.end // block_size) <= self.max_blocks_per_row for chunk in chunks
        )

    def fill(self, chunks: list[ScheduledChunk], bucket: int) -> None:
        """Copies the decode rows `chunks` in, then padding rows up to `bucket`."""
        block_size, num_blocks = self._kv_pool.block_size, self._kv_pool.num_blocks
        meta: list[list[int]] = [[], [], [], []]
        tables = [chunk.request.block_table[: -(-chunk.end // block_size)] for chunk in chunks]
        for chunk, table in zip(chunks, tables, strict=True):
            position = chunk.start
            meta[TOKEN].append(chunk.request.token_at(position))
            meta[POSITION].append(position)
            meta[SLOT].append(table[position // block_size] * block_size + position % block_size)
            meta[CONTEXT_LEN].append(chunk.end)
        width = max(map(len, tables), default=1)
        flat_tables: list[int] = []
        for table in tables:
            if max(table) >= num_blocks:  # the kernels read and write listed blocks unchecked
                raise IndexError(f"a block table lists a block outside the pool's {num_blocks}")
            flat_tables += table + [0] * (width - len(table))
        self._copy_in(meta, flat_tables, width, bucket)

    def fill_padding(self, bucket: int) -> None:
        """Every row of `bucket` a padding row: what warm-up and capture run on, touching the scratch block only."""
        self._copy_in([[], [], [], []], [], 1, bucket)

    def _copy_in(self, meta: list[list[int]], flat_tables: list[int], width: int, bucket: int) -> None:
        num_padding = bucket - len(meta[TOKEN])
        padding = (0, 0, self._scratch_slot, 1)  # token, position, slot, context length of a padding row
        for values, pad in zip(meta, padding, strict=True):
            values.extend([pad] * num_padding)
        flat_tables += [self._kv_pool.scratch_block] * (num_padding * width)
        host_meta = torch.frombuffer(array("i", [value for values in meta for value in values]), dtype=torch.int32)
        host_tables = torch.frombuffer(array("i", flat_tables), dtype=torch.int32)
        # Asynchronous from pageable memory: the driver stages the bytes at once, and the step waits for nothing.
        self.meta[:, :bucket].copy_(host_meta.view(4, bucket), non_blocking=True)
        self.block_tables[:bucket, :width].copy_(host_tables.view(bucket, width), non_blocking=True)

    def step(self, bucket: int, num_splits: int) -> PagedStep:
        """The PagedStep of the first `bucket` rows, as views of the buffers (and, in a graph, conversions of them
        recorded with it): the Triton decode kernel over every row, split `num_splits` ways whatever the lengths."""
        longs = self.meta[:, :bucket].long()  # [4, bucket]: index_copy_ and the embedding want int64
        slot_mapping = longs[SLOT]
        decode = TritonDecodeRows(
            token_index=self.token_index[:bucket],
            block_tables=self.block_tables[:bucket],
            context_lens=self.meta[CONTEXT_LEN, :bucket],
            num_splits=num_splits,
        )
        return PagedStep(
            input_ids=longs[TOKEN][None],
            position_ids=longs[POSITION][None],
            slot_mapping=slot_mapping,
            logits_indices=self.row_index[:bucket],
            token_rows=self.row_index[:bucket],
            gathered={},
            decode_table=None,
            flash=None,
            triton=TritonStep(slot_mapping, decode, None),
        )
