"""A cohort-batching engine: one thread owns the device and runs the requests that arrive together as one batch.

When idle, the engine thread waits for a request, lingers `cohort_wait_s` so that concurrent submissions join it,
and takes up to `max_batch_size` waiting requests as a cohort. It prefills the cohort's left-padded prompts in one
forward pass, then decodes all rows together over one DynamicCache; a row that finishes (stop token, length, cancel)
is dropped from the batch and its cache rows with it.

Limitation: requests that arrive while a cohort runs wait until the whole cohort has finished, so one long request
holds up everything queued behind it, and the cohort's left padding stays in the cache until the cohort ends. The
continuous-batching engine that replaces this one admits requests between steps instead.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from tasks.messages import FinishReason
from worker.engine import EngineOutput, EngineRequest, OutputCallback
from worker.model_runner import ModelRunner
from worker.sampler import sample_next_tokens

logger = logging.getLogger(__name__)

PAD_TOKEN_ID = 0  # any valid id: padded positions are masked out


@dataclass
class EngineStats:
    num_steps: int = 0  # forward passes, prefills included
    num_prefill_batches: int = 0
    max_batch_size_seen: int = 0
    batch_size_histogram: dict[int, int] = field(default_factory=dict)  # rows in a forward pass -> passes

    def record_step(self, batch_size: int, is_prefill: bool) -> None:
        self.num_steps += 1
        self.num_prefill_batches += int(is_prefill)
        self.max_batch_size_seen = max(self.max_batch_size_seen, batch_size)
        self.batch_size_histogram[batch_size] = self.batch_size_histogram.get(batch_size, 0) + 1

    def snapshot(self) -> EngineStats:
        return dataclasses.replace(self, batch_size_histogram=dict(self.batch_size_histogram))


@dataclass
class _Row:
    request: EngineRequest
    on_output: OutputCallback
    generator: torch.Generator
    num_generated: int = 0
    is_finished: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids) + self.num_generated


@dataclass
class _Batch:
    """The running rows of a cohort and their device state, row i of every tensor belonging to rows[i]."""

    rows: list[_Row]
    cache: DynamicCache
    attention_mask: torch.Tensor  # [B, L], 0 on left padding
    positions: torch.Tensor  # [B], position of each row's last token
    tokens: torch.Tensor | None = None  # [B], each row's last sampled token

    def keep(self, indices: list[int]) -> None:
        index = torch.tensor(indices, dtype=torch.long, device=self.attention_mask.device)
        self.rows = [self.rows[i] for i in indices]
        self.cache.batch_select_indices(index)
        self.attention_mask = self.attention_mask[index]
        self.positions = self.positions[index]
        self.tokens = None if self.tokens is None else self.tokens[index]


def left_pad(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns input_ids and attention_mask, both [B, T] with T the longest prompt."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = [[PAD_TOKEN_ID] * (width - len(prompt)) + prompt for prompt in prompts]
    attention_mask = [[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in prompts]
    return torch.tensor(input_ids, device=device), torch.tensor(attention_mask, device=device)


class BatchEngine:
    """Implements `worker.engine.Engine`; `submit` and `cancel` may be called from any thread."""

    def __init__(self, runner: ModelRunner, max_batch_size: int, cohort_wait_s: float = 0.002) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self._runner = runner
        self._max_batch_size = max_batch_size
        self._cohort_wait_s = cohort_wait_s
        self._cond = threading.Condition()
        self._waiting: deque[tuple[EngineRequest, OutputCallback]] = deque()
        self._active: set[str] = set()  # submitted and not yet finished
        self._cancelled: set[str] = set()
        self._is_stopping = False
        self._stats = EngineStats()
        self._shared_generator = torch.Generator(device=runner.device)
        self._shared_generator.seed()
        self._thread = threading.Thread(target=self._run, name="batch-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float | None = None) -> None:
        """Aborts running and waiting requests and ends the engine thread."""
        with self._cond:
            self._is_stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        else:
            self._abort_waiting()

    def submit(self, request: EngineRequest, on_output: OutputCallback) -> None:
        with self._cond:
            if self._is_stopping:
                raise RuntimeError("the engine is stopping and takes no new requests")
            if request.request_id in self._active:
                raise ValueError(f"request {request.request_id!r} is already in the engine")
            self._active.add(request.request_id)
            self._waiting.append((request, on_output))
            self._cond.notify_all()

    def cancel(self, request_id: str) -> None:
        with self._cond:
            if request_id in self._active:
                self._cancelled.add(request_id)

    @property
    def stats(self) -> EngineStats:
        with self._cond:
            return self._stats.snapshot()

    def _run(self) -> None:
        with torch.inference_mode():
            while (cohort := self._take_cohort()) is not None:
                self._run_cohort(cohort)
        self._abort_waiting()

    def _take_cohort(self) -> list[tuple[EngineRequest, OutputCallback]] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._waiting or self._is_stopping)
            if self._is_stopping:
                return None
        time.sleep(self._cohort_wait_s)
        with self._cond:
            num_taken = min(len(self._waiting), self._max_batch_size)
            return [self._waiting.popleft() for _ in range(num_taken)]

    def _run_cohort(self, cohort: list[tuple[EngineRequest, OutputCallback]]) -> None:
        rows = [row for row in (self._admit(request, on_output) for request, on_output in cohort) if row]
        if not rows:
            return
        try:
            self._generate(rows)
        except Exception as exc:
            logger.exception("cohort of %d requests failed", len(rows))
            for row in rows:
                if not row.is_finished:
                    self._finish(row, EngineOutput(row.request.request_id, [], error=str(exc)))

    def _admit(self, request: EngineRequest, on_output: OutputCallback) -> _Row | None:
        """A row for the request, or None after finishing it at once (invalid or already cancelled)."""
        row = _Row(request, on_output, self._generator_for(request))
        error = self._check(request)
        if error is not None:
            self._finish(row, EngineOutput(request.request_id, [], error=error))
        elif self._is_cancelled(request.request_id):
            self._finish(row, EngineOutput(request.request_id, [], FinishReason.ABORT))
        return None if row.is_finished else row

    def _generator_for(self, request: EngineRequest) -> torch.Generator:
        if request.sampling.seed is None:
            return self._shared_generator
        return torch.Generator(device=self._runner.device).manual_seed(request.sampling.seed)

    def _check(self, request: EngineRequest) -> str | None:
        num_prompt_tokens = len(request.prompt_token_ids)
        max_prompt_tokens = self._runner.max_model_len - 1
        if num_prompt_tokens == 0:
            return "the prompt is empty"
        if num_prompt_tokens > max_prompt_tokens:
            return (
                f"the prompt has {num_prompt_tokens} tokens; at most {max_prompt_tokens} fit this model's context "
                f"of {self._runner.max_model_len} tokens with one to generate"
            )
        if request.sampling.max_tokens < 1:
            return f"max_tokens must be at least 1, got {request.sampling.max_tokens}"
        return None

    def _generate(self, rows: list[_Row]) -> None:
        batch = self._prefill(rows)
        while batch.rows:
            self._decode(batch)

    def _prefill(self, rows: list[_Row]) -> _Batch:
        input_ids, attention_mask = left_pad([row.request.prompt_token_ids for row in rows], self._runner.device)
        position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, T]
        batch = _Batch(rows, self._runner.new_cache(), attention_mask, position_ids[:, -1])
        logits = self._runner.forward(input_ids, attention_mask, position_ids, batch.cache)
        self._record_step(len(rows), is_prefill=True)
        self._advance(batch, logits)
        return batch

    def _decode(self, batch: _Batch) -> None:
        ones = torch.ones_like(batch.attention_mask[:, :1])
        batch.attention_mask = torch.cat([batch.attention_mask, ones], dim=-1)  # [B, L + 1]
        batch.positions = batch.positions + 1
        logits = self._runner.forward(
            batch.tokens[:, None], batch.attention_mask, batch.positions[:, None], batch.cache
        )
        self._record_step(len(batch.rows), is_prefill=False)
        self._advance(batch, logits)

    def _advance(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Samples a token per row, emits it, and drops the rows that finished."""
        rows = batch.rows
        tokens = sample_next_tokens(logits, [row.request.sampling for row in rows], [row.generator for row in rows])
        for row, token in zip(rows, tokens.tolist(), strict=True):
            self._emit_token(row, token)
        batch.tokens = tokens
        running = [i for i, row in enumerate(rows) if not row.is_finished]
        if len(running) < len(rows):
            batch.keep(running)

    def _emit_token(self, row: _Row, token: int) -> None:
        request_id = row.request.request_id
        if self._is_cancelled(request_id):
            self._finish(row, EngineOutput(request_id, [], FinishReason.ABORT))
            return
        row.num_generated += 1
        finish_reason = self._finish_reason(row, token)
        output = EngineOutput(request_id, [token], finish_reason)
        if finish_reason is None:
            self._deliver(row, output)
        else:
            self._finish(row, output)

    def _finish_reason(self, row: _Row, token: int) -> FinishReason | None:
        sampling = row.request.sampling
        is_eos = token in self._runner.eos_token_ids and not sampling.ignore_eos
        if is_eos or token in sampling.stop_token_ids:
            return FinishReason.STOP
        if row.num_generated >= sampling.max_tokens or row.num_tokens >= self._runner.max_model_len:
            return FinishReason.LENGTH
        return None

    def _is_cancelled(self, request_id: str) -> bool:
        with self._cond:
            return self._is_stopping or request_id in self._cancelled

    def _finish(self, row: _Row, output: EngineOutput) -> None:
        row.is_finished = True
        with self._cond:
            self._active.discard(row.request.request_id)
            self._cancelled.discard(row.request.request_id)
        self._deliver(row, output)

    def _deliver(self, row: _Row, output: EngineOutput) -> None:
        try:
            row.on_output(output)
        except Exception:
            logger.exception("output callback of request %s raised", output.request_id)

    def _record_step(self, batch_size: int, is_prefill: bool) -> None:
        with self._cond:
            self._stats.record_step(batch_size, is_prefill)

    def _abort_waiting(self) -> None:
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        for request, on_output in waiting:
            row = _Row(request, on_output, self._shared_generator)
            self._finish(row, EngineOutput(request.request_id, [], FinishReason.ABORT))
