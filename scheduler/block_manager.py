"""A fixed pool of KV blocks, each `block_size` token slots, handed out to requests' block tables.

With prefix caching, a full block is known by a chained hash (its parent's hash, its token ids, and the request's
steering key, since steering changes the K/V). A new request takes every leading block already in the pool by
reference, after checking the stored tokens, not just the hash. Blocks nobody references stay cached, in
least-recently-freed order, until an allocation needs them.

When every layer of the model attends through a sliding window (Mistral), a request's leading blocks that no later
query can see are handed back as it goes, so a long context holds about a window of blocks. Their block table
entries stay, as block 0, so that a position still finds its block by `position // block_size`; the kernels never
read an entry before the window.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from scheduler.block_hash import BlockKey, block_hash
from scheduler.request import Request


@dataclass(frozen=True)
class PrefixLookup:
    num_queried_blocks: int  # leading full blocks looked up, up to and including the first miss
    num_hit_blocks: int


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and cached
    key: BlockKey | None = None  # what the hash stands for, to verify a hit


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        sliding_window: int | None = None,  # the widest layer window when every layer slides; None: some do not
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one slot, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self._blocks = [Block(block_id) for block_id in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # unreferenced, LRU first
        self._cached: dict[bytes, int] = {}  # hash -> block id

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

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
        for _ in range(num_missing):
            block_id, _ = self._free.popitem(last=False)
            self._evict(self._blocks[block_id])
            self._blocks[block_id].ref_count = 1
            request.block_table.append(block_id)

    def free(self, request: Request) -> None:
        """Drops the request's references; the tail first, so shared leading blocks outlive it in the cache."""
        for block_id in reversed(request.block_table[request.num_released_blocks :]):
            self._drop_reference(block_id)
        request.block_table = []
        request.block_hashes = []
        request.num_released_blocks = 0

    def release_out_of_window(self, request: Request) -> None:
        """With every layer sliding, hands back the request's leading blocks that its next query (at position
        num_computed_tokens) and every later one no longer see: those wholly before position
        num_computed_tokens - sliding_window + 1. Call it after `cache_full_blocks`, which registers them first."""
        if self.sliding_window is None:
            return
        first_seen = max(0, request.num_computed_tokens - self.sliding_window + 1)
        num_unseen = min(first_seen // self.block_size, len(request.block_table))
        for index in range(request.num_released_blocks, num_unseen):
            self._drop_reference(request.block_table[index])
            request.block_table[index] = 0
        request.num_released_blocks = max(request.num_released_blocks, num_unseen)

    def _drop_reference(self, block_id: int) -> None:
        block = self._blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None

    def reuse_cached_prefix(self, request: Request) -> PrefixLookup:
        """Gives a request with nothing computed every leading full block already cached. At least one token is
        left to compute, so the step that follows yields the next token."""
        if not self.enable_prefix_caching or request.block_table or not request.may_reuse_cached_prefix:
            return PrefixLookup(0, 0)
        hits: list[tuple[int, bytes]] = []
        parent: bytes | None = None
        num_queried = 0
        for index in range((request.num_tokens - 1) // self.block_size):
            key = self._key(request, index, parent)
            parent = block_hash(key)
            block_id = self._cached.get(parent)
            num_queried += 1
            if block_id is None or self._blocks[block_id].key != key:
                break
            hits.append((block_id, parent))
        for block_id, hash_value in hits:
            self._blocks[block_id].ref_count += 1
            self._free.pop(block_id, None)
            request.block_table.append(block_id)
            request.block_hashes.append(hash_value)
        request.num_computed_tokens = len(hits) * self.block_size
        return PrefixLookup(num_queried, len(hits))

    def cache_full_blocks(self, request: Request) -> None:
        """Registers the request's blocks that its computed tokens have filled since the last call."""
        if not self.enable_prefix_caching:
            return
        # Only tokens both computed and appended: accepted proposals join the output after their K/V is written.
        num_tokens = min(request.num_computed_tokens, request.num_tokens)
        for index in range(len(request.block_hashes), num_tokens // self.block_size):
            parent = request.block_hashes[-1] if request.block_hashes else None
            key = self._key(request, index, parent)
            hash_value = block_hash(key)
            block = self._blocks[request.block_table[index]]
            if block.hash is None:
                block.hash, block.key = hash_value, key
                self._cached[hash_value] = block.block_id
            request.block_hashes.append(hash_value)

    def num_reclaimable_blocks(self, request: Request) -> int:
        """Blocks freeing the request would return to the pool: those no other request holds."""
        held = request.block_table[request.num_released_blocks :]
        return sum(1 for block_id in held if self._blocks[block_id].ref_count == 1)

    def _key(self, request: Request, index: int, parent: bytes | None) -> BlockKey:
        start = index * self.block_size
        return BlockKey(parent, tuple(request.token_ids(start, start + self.block_size)), request.steering_key)

    def _evict(self, block: Block) -> None:
        if block.hash is not None and self._cached.get(block.hash) == block.block_id:
            del self._cached[block.hash]
        block.hash = block.key = None
