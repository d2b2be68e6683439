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
