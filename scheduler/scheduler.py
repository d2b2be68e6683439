"""Continuous batching: which requests run this step, and how many of their tokens, within a token budget.

Each step, running requests go first in priority order (a decode needs one token, a prompt being prefilled at most
one chunk), then waiting requests are admitted while the budget, the sequence limit and the KV pool allow. When a
running request needs a block and none is free, the lowest-priority, latest running request is preempted: its blocks
are freed and it waits to recompute from token 0. A waiting request of better priority than some running one may
preempt it the same way, so chat is never stuck behind a pool full of bulk work.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.batch import Batch, ScheduledChunk
from scheduler.block_manager import BlockManager
from scheduler.request import SCHEDULING_ORDER, Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int  # token budget of one step
    prefill_chunk_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = False
    sliding_window: int | None = None  # the widest layer window when every layer slides: older blocks are freed

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "prefill_chunk_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class TokenUpdate:
    """One request's new tokens after a step (several when proposed tokens were accepted), and how it finished."""

    request: Request
    token_ids: list[int]
    finish_reason: str | None


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_manager = BlockManager(
            config.num_blocks, config.block_size, config.enable_prefix_caching, config.sliding_window
        )
        self.waiting: list[Request] = []  # kept sorted by (priority, arrival)
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_prefix_queried_blocks = 0  # over admissions; a head-of-line request that waits is counted once
        self.num_prefix_hit_blocks = 0
        self._num_arrivals = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def max_tokens_fitting(self) -> int:
        """The most tokens one request can ever hold: its whole sequence must fit the pool."""
        return min(self.config.max_model_len, self.config.num_blocks * self.config.block_size)

    def add(self, request: Request) -> None:
        request.arrival_index = self._num_arrivals
        self._num_arrivals += 1
        request.status = RequestStatus.WAITING
        self._enqueue_waiting(request)

    def abort(self, request_id: str) -> Request | None:
        """Finishes the request as aborted and frees its blocks; None if it is not here."""
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._finish(request, RequestStatus.FINISHED_ABORTED)
                    return request
        return None

    def schedule(self) -> Batch:
        batch = Batch()
        budget = self._schedule_running(batch, self.config.max_num_batched_tokens)
        if not batch.preempted:  # the pool is short: admitting more would only preempt again
            self._schedule_waiting(batch, budget)
        return batch

    def update_from_output(self, batch: Batch, sampled_token_ids: list[list[int]]) -> list[TokenUpdate]:
        """Advances every chunk; `sampled_token_ids` has, per sampling chunk in batch order, its accepted proposed
        tokens and then one sampled token. Rejected proposals are rolled back: their K/V lie past the request's
        computed length, to be overwritten."""
        sampled = iter(sampled_token_ids)
        updates = []
        for chunk in batch.chunks:
            request = chunk.request
            end = chunk.start + chunk.num_tokens
            if request.spec_token_ids:
                request.spec_token_ids = []
            if not chunk.is_sampling:
                request.num_computed_tokens = end
                self.block_manager.cache_full_blocks(request)
            else:
                tokens = next(sampled)
                request.num_computed_tokens = end - chunk.num_spec_tokens + max(len(tokens) - 1, 0)
                updates.append(self._append_tokens(request, tokens))  # caches its full blocks before it may finish
            if not request.is_finished:
                self.block_manager.release_out_of_window(request)
        return updates

    def _schedule_running(self, batch: Batch, budget: int) -> int:
        self.running.sort(key=SCHEDULING_ORDER)
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_tokens = self._chunk_size(request, budget)
            if request.spec_token_ids and not self._fits(request, num_tokens):
                request.spec_token_ids = []  # proposals never cost another request its blocks: decode plainly
                num_tokens = self._chunk_size(request, budget)
            if not self._make_room(request, request.num_computed_tokens + num_tokens, batch):
                break  # the request preempted itself: it and everything after it are back in waiting
            batch.chunks.append(self._scheduled(request, num_tokens))
            budget -= num_tokens
            index += 1
        return budget

    def _make_room(self, request: Request, num_tokens: int, batch: Batch) -> bool:
        """Preempts from the back of `running` until `request` fits; False if it had to preempt itself."""
        while not self.block_manager.can_allocate(request, num_tokens):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, batch: Batch, budget: int) -> None:
        while self.waiting and budget > 0:
            request = self.waiting[0]
            lookup = self.block_manager.reuse_cached_prefix(request)
            num_tokens = self._chunk_size(request, budget)
            while not self._has_room(request, request.num_computed_tokens + num_tokens):
                if not self._can_preempt_for(request, request.num_computed_tokens + num_tokens):
                    self._release(request)
                    return
                budget += self._preempt(max(self.running, key=SCHEDULING_ORDER), batch)
                num_tokens = self._chunk_size(request, budget)
            self.waiting.pop(0)
            self.num_prefix_queried_blocks += lookup.num_queried_blocks
            self.num_prefix_hit_blocks += lookup.num_hit_blocks
            if request.num_cached_tokens < 0:  # the first admission is the one usage reports
                request.num_cached_tokens = min(request.num_computed_tokens, request.num_prompt_tokens)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            batch.chunks.append(self._scheduled(request, num_tokens))
            budget -= num_tokens

    def _release(self, request: Request) -> None:
        """Gives back what an admission that did not happen took (cached blocks), leaving the request as it was."""
        self.block_manager.free(request)
        request.num_computed_tokens = 0

    def _has_room(self, request: Request, num_tokens: int) -> bool:
        return len(self.running) < self.config.max_num_seqs and self.block_manager.can_allocate(request, num_tokens)

    def _fits(self, request: Request, num_tokens: int) -> bool:
        """The whole chunk fits the budget's share and the free blocks, without preempting anyone."""
        is_whole = num_tokens == request.num_uncomputed_tokens
        return is_whole and self.block_manager.can_allocate(request, request.num_computed_tokens + num_tokens)

    def _can_preempt_for(self, request: Request, num_tokens: int) -> bool:
        """Whether preempting every running request of worse priority would make room; else preempt none."""
        victims = [r for r in self.running if r.priority > request.priority]
        has_seat = len(self.running) - len(victims) < self.config.max_num_seqs
        reclaimable = sum(self.block_manager.num_reclaimable_blocks(victim) for victim in victims)
        needed = self.block_manager.num_missing_blocks(request, num_tokens)
        return bool(victims) and has_seat and self.block_manager.num_free_blocks + reclaimable >= needed

    def _chunk_size(self, request: Request, budget: int) -> int:
        return min(request.num_uncomputed_tokens, self.config.prefill_chunk_size, budget)

    def _scheduled(self, request: Request, num_tokens: int) -> ScheduledChunk:
        self.block_manager.allocate(request, request.num_computed_tokens + num_tokens)
        return ScheduledChunk.of(request, num_tokens)

    def _preempt(self, request: Request, batch: Batch) -> int:
        """Returns the budget the request's chunk in this batch held, if it had one."""
        chunk = next((c for c in batch.chunks if c.request is request), None)
        if chunk is not None:
            batch.chunks.remove(chunk)
        self.running.remove(request)
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        batch.preempted.append(request)
        self._enqueue_waiting(request)
        return chunk.num_tokens if chunk is not None else 0

    def _enqueue_waiting(self, request: Request) -> None:
        self.waiting.append(request)
        self.waiting.sort(key=SCHEDULING_ORDER)

    def _append_tokens(self, request: Request, token_ids: list[int]) -> TokenUpdate:
        """Appends in order until the request finishes; tokens after a stop are dropped. A request of max_tokens 0
        (a prompt scored only) ends once its prompt is computed, appending nothing."""
        if request.max_tokens == 0:
            self.block_manager.cache_full_blocks(request)
            self.running.remove(request)
            self._finish(request, RequestStatus.FINISHED_LENGTH)
            return TokenUpdate(request, [], request.finish_reason)
        appended = []
        for token_id in token_ids:
            request.output_token_ids.append(token_id)
            appended.append(token_id)
            status = self._finished_status(request, token_id)
            if status is not None:
                self.block_manager.cache_full_blocks(request)
                self.running.remove(request)
                self._finish(request, status)
                break
        else:
            self.block_manager.cache_full_blocks(request)
        return TokenUpdate(request, appended, request.finish_reason)

    def _finished_status(self, request: Request, token_id: int) -> RequestStatus | None:
        num_outputs = len(request.output_token_ids)
        if token_id in request.stop_token_ids and num_outputs > request.min_tokens:
            return RequestStatus.FINISHED_STOPPED
        num_tokens = len(request.prompt_token_ids) + num_outputs
        if num_outputs >= request.max_tokens or num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.block_manager.free(request)
