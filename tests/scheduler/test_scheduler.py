"""The scheduler alone, without a model: a fake step samples token 100 + the request's output count."""

from __future__ import annotations

import dataclasses

from scheduler.batch import Batch
from scheduler.request import Request, RequestStatus
from scheduler.scheduler import Scheduler, SchedulerConfig, TokenUpdate

EOS = 2
CONFIG = SchedulerConfig(
    max_num_seqs=4, max_num_batched_tokens=64, prefill_chunk_size=32, max_model_len=512, num_blocks=64, block_size=4
)


def request(request_id: str, num_prompt: int, max_tokens: int = 8, priority: int = 0) -> Request:
    return Request(request_id, list(range(10, 10 + num_prompt)), max_tokens, frozenset({EOS}), priority=priority)


def step(scheduler: Scheduler, tokens: dict[str, int] | None = None) -> tuple[Batch, list[TokenUpdate]]:
    batch = scheduler.schedule()
    chunks = batch.sampling_chunks
    sampled = [[(tokens or {}).get(c.request.request_id, 100 + c.request.num_output_tokens)] for c in chunks]
    return batch, scheduler.update_from_output(batch, sampled)


def run_to_completion(scheduler: Scheduler) -> int:
    num_steps = 0
    while scheduler.has_work:
        step(scheduler)
        num_steps += 1
    return num_steps


def test_prefill_then_decode_then_length() -> None:
    scheduler = Scheduler(CONFIG)
    r = request("a", 10, max_tokens=3)
    scheduler.add(r)
    batch, updates = step(scheduler)
    assert [(c.start, c.num_tokens, c.is_sampling) for c in batch.chunks] == [(0, 10, True)]
    assert [u.token_ids for u in updates] == [[100]]
    batch, _ = step(scheduler)
    assert [(c.start, c.num_tokens, c.is_decode) for c in batch.chunks] == [(10, 1, True)]
    _, updates = step(scheduler)
    assert updates[0].finish_reason == "length" and r.status is RequestStatus.FINISHED_LENGTH
    assert r.output_token_ids == [100, 101, 102]
    assert scheduler.block_manager.num_free_blocks == CONFIG.num_blocks and not scheduler.has_work


def test_stop_token_finishes_only_after_min_tokens() -> None:
    scheduler = Scheduler(CONFIG)
    eager, patient = request("eager", 3), dataclasses.replace(request("patient", 3), min_tokens=2)
    scheduler.add(eager)
    scheduler.add(patient)
    step(scheduler, {"eager": EOS, "patient": EOS})
    assert eager.finish_reason == "stop"
    assert patient.status is RequestStatus.RUNNING
    step(scheduler, {"patient": EOS})
    assert patient.status is RequestStatus.RUNNING
    step(scheduler, {"patient": EOS})
    assert patient.finish_reason == "stop" and patient.num_output_tokens == 3


def test_long_prompt_is_chunked_and_running_decodes_go_on() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, prefill_chunk_size=16, max_num_batched_tokens=20))
    short = request("short", 4, max_tokens=20)
    scheduler.add(short)
    step(scheduler)
    scheduler.add(request("long", 50))
    chunk_sizes = []
    while (long_chunks := [c for c in step(scheduler)[0].chunks if c.request.request_id == "long"])[0].start < 48:
        chunk_sizes.append(long_chunks[0].num_tokens)
        assert short.status is RequestStatus.RUNNING
    assert chunk_sizes == [16, 16, 16]  # each step also decoded `short` within the budget of 20
    assert short.num_output_tokens == 1 + 4


def test_token_budget_and_sequence_limit_hold() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, max_num_seqs=2, max_num_batched_tokens=24))
    for i in range(5):
        scheduler.add(request(f"r{i}", 20))
    while scheduler.has_work:
        batch, _ = step(scheduler)
        assert batch.num_tokens <= 24 and len(batch.chunks) <= 2 and len(scheduler.running) <= 2


def test_preemption_when_the_pool_runs_out_frees_and_recomputes() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, num_blocks=6))  # 24 slots
    first, second = request("first", 8, max_tokens=10), request("second", 8, max_tokens=10)
    scheduler.add(first)
    scheduler.add(second)
    preempted = []
    while scheduler.has_work:
        batch, _ = step(scheduler)
        preempted += [r.request_id for r in batch.preempted]
        used = sum(len(r.block_table) for r in scheduler.running)
        assert used + scheduler.block_manager.num_free_blocks == 6
    assert preempted and preempted[0] == "second"  # the later arrival yields
    assert first.output_token_ids == [100 + i for i in range(10)]
    assert second.output_token_ids == [100 + i for i in range(10)]  # recomputed, then went on where it was
    assert scheduler.num_preemptions == len(preempted)
    assert scheduler.block_manager.num_free_blocks == 6


def test_better_priority_waiting_request_preempts_a_worse_running_one() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, max_num_seqs=2))
    bulk = [request(f"bulk{i}", 4, max_tokens=50, priority=1) for i in range(3)]
    for r in bulk:
        scheduler.add(r)
    step(scheduler)
    chat = request("chat", 4, max_tokens=2)
    scheduler.add(chat)
    batch, _ = step(scheduler)
    assert chat in [c.request for c in batch.chunks]
    assert [r.request_id for r in batch.preempted] == ["bulk1"]
    assert len(scheduler.running) == 2


def test_equal_priority_waits_its_turn_fifo() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, max_num_seqs=1))
    for name in ("a", "b", "c"):
        scheduler.add(request(name, 4, max_tokens=2))
    order = []
    while scheduler.has_work:
        for update in step(scheduler)[1]:
            if update.finish_reason:
                order.append(update.request.request_id)
    assert order == ["a", "b", "c"]


def test_abort_frees_blocks_wherever_the_request_is() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, max_num_seqs=1))
    running, waiting = request("running", 10), request("waiting", 10)
    scheduler.add(running)
    scheduler.add(waiting)
    step(scheduler)
    assert scheduler.abort("running") is running and running.finish_reason == "abort"
    assert scheduler.abort("waiting") is waiting and scheduler.abort("unknown") is None
    assert scheduler.block_manager.num_free_blocks == CONFIG.num_blocks and not scheduler.has_work


def test_context_limit_ends_with_length() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, max_model_len=12))
    r = request("r", 10, max_tokens=100)
    scheduler.add(r)
    assert run_to_completion(scheduler) == 2
    assert r.finish_reason == "length" and r.num_tokens == 12


def test_proposals_never_preempt_a_request_that_fits_without_them() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, num_blocks=4, max_model_len=64))
    long, short = request("long", 7, max_tokens=8), request("short", 3, max_tokens=12)
    scheduler.add(long)
    scheduler.add(short)
    step(scheduler)
    assert scheduler.block_manager.num_free_blocks == 1
    short.spec_token_ids = [5, 6, 7, 8, 9, 10]  # would need two more blocks
    batch = scheduler.schedule()
    assert [(c.request.request_id, c.num_tokens) for c in batch.chunks] == [("long", 1), ("short", 1)]
    assert batch.preempted == [] and short.num_computed_tokens == 3


def test_priority_preemption_happens_only_when_it_makes_room() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, num_blocks=4, max_model_len=64))
    chat, bulk = request("chat", 7, max_tokens=8), request("bulk", 3, max_tokens=8, priority=1)
    scheduler.add(chat)
    scheduler.add(bulk)
    step(scheduler)
    too_big = request("too-big", 12, max_tokens=2)  # needs 3 blocks: the free one and bulk's one are not enough
    scheduler.add(too_big)
    batch = scheduler.schedule()
    assert batch.preempted == [] and bulk.status is RequestStatus.RUNNING
    assert too_big.status is RequestStatus.WAITING


def test_with_every_layer_sliding_a_long_request_holds_about_a_window_of_blocks() -> None:
    scheduler = Scheduler(dataclasses.replace(CONFIG, sliding_window=8))
    r = request("a", 100, max_tokens=40)
    scheduler.add(r)
    held_in_prefill, held_in_decode = [], []
    while scheduler.has_work:
        batch, _ = step(scheduler)
        held = len(r.block_table) - r.num_released_blocks
        (held_in_decode if batch.chunks and batch.chunks[0].is_decode else held_in_prefill).append(held)
    # a 32-token chunk and the 8 tokens before it, over blocks of 4; then the window and the new token
    assert max(held_in_prefill) <= (32 + 8) // 4 + 1
    assert max(held_in_decode) <= 8 // 4 + 1
    assert scheduler.block_manager.num_free_blocks == CONFIG.num_blocks  # 140 tokens would hold 35 blocks
