from __future__ import annotations

import pytest

from scheduler.block_manager import BlockManager
from scheduler.request import Request


def test_allocate_grows_the_table_and_free_returns_every_block() -> None:
    blocks = BlockManager(num_blocks=4, block_size=16)
    request = Request("r", [1] * 20, max_tokens=5)
    assert blocks.can_allocate(request, 20)
    blocks.allocate(request, 20)
    assert len(request.block_table) == 2 and blocks.num_free_blocks == 2
    blocks.allocate(request, 32)  # still two blocks
    assert len(request.block_table) == 2
    blocks.allocate(request, 33)
    assert len(request.block_table) == 3 and blocks.num_free_blocks == 1
    assert not blocks.can_allocate(request, 65)
    with pytest.raises(RuntimeError):
        blocks.allocate(request, 65)
    blocks.free(request)
    assert request.block_table == [] and blocks.num_free_blocks == 4


def test_blocks_are_never_shared() -> None:
    blocks = BlockManager(num_blocks=6, block_size=4)
    first, second = Request("a", [1], 1), Request("b", [1], 1)
    blocks.allocate(first, 12)
    blocks.allocate(second, 12)
    assert not set(first.block_table) & set(second.block_table)


def test_an_empty_pool_is_refused() -> None:
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0, block_size=16)


def test_with_every_layer_sliding_blocks_out_of_the_window_go_back_to_the_pool() -> None:
    blocks = BlockManager(num_blocks=8, block_size=4, sliding_window=6)
    request = Request("r", list(range(30)), max_tokens=5)
    blocks.allocate(request, 16)
    table = list(request.block_table)
    request.num_computed_tokens = 12  # the next query, at 12, sees 7..12: block 0 (tokens 0..3) is out of reach
    blocks.release_out_of_window(request)
    assert request.block_table == [0, *table[1:]] and request.num_released_blocks == 1
    assert blocks.num_free_blocks == 5 and blocks.num_reclaimable_blocks(request) == 3
    request.num_computed_tokens = 14  # sees 9..14: block 1 (4..7) too
    blocks.release_out_of_window(request)
    request.num_computed_tokens = 13  # a rollback (rejected proposals) gives nothing back
    blocks.release_out_of_window(request)
    assert request.block_table[:2] == [0, 0] and request.num_released_blocks == 2 and blocks.num_free_blocks == 6
    blocks.allocate(request, 20)  # positions still find their blocks: the table keeps its length
    assert len(request.block_table) == 5
    blocks.free(request)
    assert blocks.num_free_blocks == 8 and request.num_released_blocks == 0


def test_without_a_window_on_every_layer_no_block_is_released() -> None:
    blocks = BlockManager(num_blocks=8, block_size=4)
    request = Request("r", list(range(30)), max_tokens=5)
    blocks.allocate(request, 16)
    table = list(request.block_table)
    request.num_computed_tokens = 16
    blocks.release_out_of_window(request)
    assert request.block_table == table and blocks.num_free_blocks == 4


def test_a_released_block_another_request_shares_stays_held() -> None:
    blocks = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True, sliding_window=4)
    first, second = Request("a", list(range(12)), max_tokens=5), Request("b", list(range(12)), max_tokens=5)
    blocks.allocate(first, 12)
    first.num_computed_tokens = 12
    blocks.cache_full_blocks(first)
    assert blocks.reuse_cached_prefix(second).num_hit_blocks == 2  # blocks 0 and 1 of the first, by reference
    blocks.release_out_of_window(first)  # the first's next query, at 12, sees 9..12: its blocks 0 and 1 are out
    assert first.num_released_blocks == 2 and blocks.num_free_blocks == 5  # still held by the second
    blocks.free(second)
    assert blocks.num_free_blocks == 7
