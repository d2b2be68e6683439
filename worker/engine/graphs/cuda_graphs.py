"""Decode-only steps as CUDA graphs: one graph per batch-size bucket, captured at warm-up over static buffers.

A decode step on a GPU is mostly kernel launches: a few hundred small kernels whose launch costs more than their
arithmetic at small batches. A graph replays them all with one launch. It replays exactly what it recorded, so the
step's inputs live in static buffers (worker/engine/graphs/decode_buffers.py), the rows are padded up to the bucket, the
Triton decode kernel's split count is fixed per bucket, and steering and monitoring are buffers rather than
branches (worker/engine/graphs/graph_hooks.py). Steps with prefill or speculative verify chunks run eagerly.

`GraphMode.EAGER_REPLAY` runs the same padded static-buffer step eagerly instead of replaying a capture: how a CPU
checks everything here but the capture itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import torch

from scheduler.batch import ScheduledChunk
from steering.batch_hooks import BatchHooks
from steering.step_plan import MonitorResult, StepPlan
from worker.engine.attention.paged_step import PagedStep
from worker.engine.graphs.decode_buffers import DecodeBuffers, bucket_for, decode_buckets, is_graph_step
from worker.engine.graphs.graph_hooks import GraphHookBuffers, HookSet
from worker.engine.graphs.graph_mode import GraphMode

logger = logging.getLogger(__name__)

Forward = Callable[[PagedStep], torch.Tensor]  # the logits [S, V] (float) of a step, attention over the pool


class ReplayableStep(Protocol):
    def replay(self) -> torch.Tensor:
        """The logits [bucket, V] of the step in the static buffers."""


class EagerStep:
    def __init__(self, run: Callable[[], torch.Tensor]) -> None:
        self._run = run

    def replay(self) -> torch.Tensor:
        return self._run()


class CapturedStep:
    """A captured graph and its output buffer, which each replay overwrites."""

    def __init__(self, graph: torch.cuda.CUDAGraph, logits: torch.Tensor) -> None:
        self._graph, self._logits = graph, logits

    def replay(self) -> torch.Tensor:
        self._graph.replay()
        return self._logits


class DecodeGraphs:
    """Per bucket, a replayable decode step over `buffers` and `hook_buffers`; engine thread only."""

    def __init__(
        self,
        forward: Forward,
        hooks: BatchHooks,
        buffers: DecodeBuffers,
        hook_buffers: GraphHookBuffers,
        num_splits: Callable[[int], int],  # the Triton decode kernel's split count for a bucket
        mode: GraphMode,
    ) -> None:
        self._forward, self._hooks = forward, hooks
        self.buffers, self.hook_buffers = buffers, hook_buffers
        self.buckets = decode_buckets(buffers.max_rows)
        self._num_splits = num_splits
        self.mode = mode
        self._steps: dict[int, ReplayableStep] = {}
        self._pool = torch.cuda.graph_pool_handle() if mode is GraphMode.CAPTURE else None

    def fits(self, chunks: list[ScheduledChunk]) -> bool:
        """Whether this step runs here: decode rows only, as many as the largest bucket, none wider than a table."""
        return is_graph_step(chunks) and self.buffers.fits(chunks)

    def warm_up(self) -> None:
        """Captures every bucket, the largest first so that the smaller ones reuse its memory."""
        if self.mode is not GraphMode.CAPTURE:
            return
        started = time.perf_counter()
        for bucket in reversed(self.buckets):
            self._step(bucket)
        logger.info("captured decode graphs for batch sizes %s in %.1fs", self.buckets, time.perf_counter() - started)

    def run(self, chunks: list[ScheduledChunk], plan: StepPlan | None) -> tuple[torch.Tensor, dict[str, MonitorResult]]:
        """The logits [B, V] of the decode rows `chunks` and their monitors' results; `plan` is the step's hooks
        as eager steps run them. The logits are a view of the graph's output: read them before the next step."""
        hooks = HookSet.of(plan)
        if not self.hook_buffers.hooks.covers(hooks):
            self.hook_buffers.extend(hooks)
            self._forget_steps()
            covered = self.hook_buffers.hooks
            logger.info(
                "decode graphs are captured again, steering at %s and reading at %s",
                sorted(point.hook_name for point in covered.steered),
                sorted(point.hook_name for point in covered.read),
            )
        num_rows = len(chunks)
        bucket = bucket_for(num_rows, self.buckets)
        replayable = self._step(bucket)  # before filling: a capture runs over padding rows
        self.buffers.fill(chunks, bucket)
        self.hook_buffers.load(plan, num_rows)
        logits = replayable.replay()[:num_rows]
        return logits, self.hook_buffers.read(plan, num_rows)

    def _forget_steps(self) -> None:
        """Drops every recorded step, to be recorded again. Dropping the last graph of a memory pool frees the pool,
        and capturing into a freed pool's handle fails an assertion in CUDA's caching allocator (seen on an H100 with
        torch 2.11), so the steps recorded from now on share a new pool."""
        self._steps.clear()
        if self.mode is GraphMode.CAPTURE:
            self._pool = torch.cuda.graph_pool_handle()

    def _step(self, bucket: int) -> ReplayableStep:
        replayable = self._steps.get(bucket)
        if replayable is None:
            replayable = self._steps[bucket] = self._record(bucket)
        return replayable

    def _record(self, bucket: int) -> ReplayableStep:
        num_splits = self._num_splits(bucket)
        plan = self.hook_buffers.capture_plan(bucket)

        def run() -> torch.Tensor:
            step = self.buffers.step(bucket, num_splits)  # inside: a graph records its conversions too
            if plan is not None:
                self._hooks.set_step(plan)
            try:
                return self._forward(step)
            finally:
                self._hooks.clear()

        if self.mode is GraphMode.EAGER_REPLAY:
            return EagerStep(run)
        return self._capture(bucket, run)

    def _capture(self, bucket: int, run: Callable[[], torch.Tensor]) -> CapturedStep:
        """Runs the step once on a side stream (Triton compiles, cuBLAS picks its kernels), then records it."""
        self.buffers.fill_padding(bucket)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a capture after start-up (new hook points) must not trip over other threads' CUDA work, such
        # as a request's steering vector being built on a Celery thread
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = run()
        return CapturedStep(graph, logits)
