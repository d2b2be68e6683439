"""A fixed pool of KV blocks, each `block_size` token slots, handed out to requests' block tables."""

from __future__ import annotations

from collections import deque

from scheduler.request import Request


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one slot, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, request: Request, num_tokens: int) -> int:
        """Blocks `request` lacks to hold its first `num_tokens` tokens."""
        return max(0, self.num_blocks_for(num_tokens) - len(request.block_table))

    def can_allocate(self, request: Request, num_tokens: int) -> bool:
        return self.num_missing_blocks(request, num_tokens) <= self.num_free_blocks

    def allocate(self, request: Request, num_tokens: int) -> None:
        """Grows the request's block table to hold `num_tokens` tokens."""
        num_missing = self.num_missing_blocks(request, num_tokens)
        if num_missing > self.num_free_blocks:
            raise RuntimeError(f"{num_missing} blocks needed, {self.num_free_blocks} free")
        request.block_table.extend(self._free_blocks.popleft() for _ in range(num_missing))

    def free(self, request: Request) -> None:
        self._free_blocks.extend(request.block_table)
        request.block_table = []
