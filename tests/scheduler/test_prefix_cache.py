"""Prefix caching in the block manager and scheduler, without a model: a fake step samples token 100 + the
request's output count, so outputs do not depend on what was cached."""

from __future__ import annotations

import dataclasses

import pytest

import scheduler.block_manager as block_manager_module
from scheduler.block_hash import BlockKey
from scheduler.request import Request
from scheduler.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.test_scheduler import step

BLOCK = 4
CONFIG = SchedulerConfig(
    max_num_seqs=8, max_num_batched_tokens=256, prefill_chunk_size=256, max_model_len=512, num_blocks=32,
    block_size=BLOCK, enable_prefix_caching=True,
)  # fmt: skip
SYSTEM = list(range(1000, 1040))  # ten full blocks


def request(request_id: str, prompt: list[int], max_tokens: int = 3, steering_key: str = "") -> Request:
    return Request(request_id, prompt, max_tokens, steering_key=steering_key)


def run_all(scheduler: Scheduler) -> None:
    while scheduler.has_work:
        step(scheduler)


def test_a_shared_prefix_is_computed_once_and_shared_by_reference() -> None:
    scheduler = Scheduler(CONFIG)
    first = request("first", [*SYSTEM, 1, 2, 3], max_tokens=20)
    scheduler.add(first)
    step(scheduler)
    second = request("second", [*SYSTEM, 7, 8])
    scheduler.add(second)
    batch, _ = step(scheduler)
    [chunk] = [c for c in batch.chunks if c.request is second]
    assert chunk.start == 40 and chunk.num_tokens == 2
    assert second.num_cached_tokens == 40
    assert second.block_table[:10] == first.block_table[:10]
    assert scheduler.num_prefix_hit_blocks == 10
    run_all(scheduler)
    assert scheduler.block_manager.num_free_blocks == CONFIG.num_blocks


def test_freed_blocks_stay_cached_until_the_pool_needs_them() -> None:
    scheduler = Scheduler(CONFIG)
    scheduler.add(request("first", [*SYSTEM, 1]))
    run_all(scheduler)
    later = request("later", [*SYSTEM, 2])
    scheduler.add(later)
    run_all(scheduler)
    assert later.num_cached_tokens == 40
    for i in range(3):  # 3 x 40 fresh tokens: more than the 32 - 10 blocks nobody caches
        scheduler.add(request(f"filler-{i}", [5000 + 100 * i + t for t in range(40)]))
        run_all(scheduler)
    evicted = request("evicted", [*SYSTEM, 3])
    scheduler.add(evicted)
    run_all(scheduler)
    assert evicted.num_cached_tokens < 40


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    scheduler = Scheduler(CONFIG)
    scheduler.add(request("first", SYSTEM))
    run_all(scheduler)
    again = request("again", SYSTEM)
    scheduler.add(again)
    batch, updates = step(scheduler)
    assert again.num_cached_tokens == 36 and batch.chunks[0].num_tokens == 4
    assert updates[0].token_ids == [100]


def test_different_steering_never_shares_blocks() -> None:
    scheduler = Scheduler(CONFIG)
    scheduler.add(request("plain", [*SYSTEM, 1]))
    run_all(scheduler)
    steered = request("steered", [*SYSTEM, 1], steering_key="sae:feature 3 x 8.0")
    scheduler.add(steered)
    run_all(scheduler)
    assert steered.num_cached_tokens == 0


def test_a_hash_collision_is_caught_by_the_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    def colliding_hash(key: BlockKey) -> bytes:
        return b"same for every block"

    monkeypatch.setattr(block_manager_module, "block_hash", colliding_hash)
    scheduler = Scheduler(CONFIG)
    scheduler.add(request("first", [*SYSTEM, 1]))
    run_all(scheduler)
    other = request("other", [*list(range(2000, 2040)), 1])
    scheduler.add(other)
    run_all(scheduler)
    assert other.num_cached_tokens == 0


def test_preempted_requests_recompute_from_the_cache() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, num_blocks=14))
    first = request("first", [*SYSTEM, 1], max_tokens=12)
    second = request("second", [*SYSTEM, 2], max_tokens=12)
    scheduler.add(first)
    scheduler.add(second)
    preempted = []
    while scheduler.has_work:
        batch, _ = step(scheduler)
        preempted += batch.preempted
    assert preempted
    assert first.output_token_ids == second.output_token_ids == [100 + i for i in range(12)]
    assert scheduler.block_manager.num_free_blocks == 14


def test_caching_off_never_hits() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, enable_prefix_caching=False))
    for name in ("a", "b"):
        scheduler.add(request(name, [*SYSTEM, 1]))
        run_all(scheduler)
    assert scheduler.num_prefix_hit_blocks == 0


def test_a_reused_free_block_is_never_handed_out_again_while_referenced() -> None:
    scheduler = Scheduler(CONFIG)
    scheduler.add(request("first", [*SYSTEM, 1]))
    run_all(scheduler)
    later = request("later", [*SYSTEM, 2], max_tokens=30)
    scheduler.add(later)
    step(scheduler)
    filler = request("filler", list(range(3000, 3080)), max_tokens=2)
    scheduler.add(filler)
    step(scheduler)
    assert not set(later.block_table) & set(filler.block_table)
    referenced = set(later.block_table) | set(filler.block_table)
    assert scheduler.block_manager.num_free_blocks == CONFIG.num_blocks - len(referenced)


def test_blocks_filled_by_accepted_proposals_are_cached_under_their_tokens() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, prefill_chunk_size=64))
    first = request("first", [1, 2, 3], max_tokens=20)
    scheduler.add(first)
    scheduler.update_from_output(scheduler.schedule(), [[4]])
    first.spec_token_ids = [5, 6, 7, 8]
    batch = scheduler.schedule()
    assert batch.chunks[0].num_tokens == 5
    scheduler.update_from_output(batch, [[5, 6, 7, 8, 9]])  # all four accepted, then the model's own token
    assert first.num_computed_tokens == 8 and first.output_token_ids == [4, 5, 6, 7, 8, 9]
    scheduler.abort("first")
    later = request("later", [1, 2, 3, 4, 5, 6, 7, 8, 9, 42])
    scheduler.add(later)
    scheduler.schedule()
    assert later.num_cached_tokens == 8


def test_a_request_waiting_for_a_seat_counts_its_prefix_hits_once() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, max_num_seqs=2))
    scheduler.add(request("first", [*SYSTEM, 1, 2, 3], max_tokens=20))
    scheduler.add(request("filler", [1, 2, 3], max_tokens=20))
    step(scheduler)
    late = request("late", [*SYSTEM, 9])
    scheduler.add(late)
    for _ in range(5):  # no seat: each step looks the prefix up again and gives it back
        step(scheduler)
        assert late in scheduler.waiting
    run_all(scheduler)
    assert late.num_cached_tokens == 40
    assert scheduler.num_prefix_hit_blocks == 10
    assert scheduler.num_prefix_queried_blocks == 1 + 0 + 10  # first: one miss; filler: no full block; late: ten
