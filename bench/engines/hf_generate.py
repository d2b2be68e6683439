"""Baselines (i) and (ii): HF `model.generate`, one request at a time and as static padded batches; and (ii) with
HF's static KV cache, which `generate` compiles with torch.compile (mode reduce-overhead: CUDA graphs) on a GPU.

Greedy with EOS disabled (`eos_token_id=None`), which is the engine's `ignore_eos`: the model may emit EOS and goes
on. (`min_new_tokens` would not do: it masks EOS logits, which changes the greedy tokens.) Token times come from a
streamer whose `put()` HF calls once per decoding step.
"""

from __future__ import annotations

import time
from collections import deque

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from bench.metrics import NAIVE_KEY, STATIC_KEY, RequestTrace, RunResult
from bench.workload import BenchRequest, wait_until


class StepTimer(BaseStreamer):
    """Records the time of each generated step; HF's first `put()` is the prompt and is skipped."""

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self._has_seen_prompt = False

    def put(self, value: torch.Tensor) -> None:  # [B] new tokens, or [B, T] the prompt
        if self._has_seen_prompt:
            self.step_times.append(time.perf_counter())
        self._has_seen_prompt = True

    def end(self) -> None:
        pass


def left_pad(prompts: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask, both [B, T] with T the longest prompt."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = [[pad_token_id] * (width - len(prompt)) + prompt for prompt in prompts]
    attention_mask = [[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in prompts]
    return torch.tensor(input_ids), torch.tensor(attention_mask)


def generate_batch_traces(
    model: PreTrainedModel, requests: list[BenchRequest], start: float, pad_token_id: int, **options: object
) -> tuple[list[RequestTrace], int]:
    """Runs the requests as one padded `generate` of the longest output (with `options` for `generate`); each row
    keeps only its own tokens.

    Returns the traces and the number of tokens generated, rows past their own length included.
    """
    input_ids, attention_mask = left_pad([request.prompt_token_ids for request in requests], pad_token_id)
    num_steps = max(request.num_output_tokens for request in requests)
    timer = StepTimer()
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.to(model.device),
            max_new_tokens=num_steps,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad_token_id,
            streamer=timer,
            **options,
        )
    new_tokens = output[:, input_ids.shape[1] :].tolist()  # [B, num_steps]
    traces = [
        RequestTrace(
            request.request_id,
            start + request.arrival_s,
            row[: request.num_output_tokens],
            timer.step_times[: request.num_output_tokens],
        )
        for request, row in zip(requests, new_tokens, strict=True)
    ]
    return traces, num_steps * len(requests)


class NaiveGenerate:
    """(i): one `generate` per request, in arrival order, waiting for the next arrival when idle."""

    key = NAIVE_KEY
    label = "(i) HF generate, one request at a time"

    def __init__(self, model: PreTrainedModel, pad_token_id: int) -> None:
        self._model = model
        self._pad_token_id = pad_token_id

    def run(self, workload: str, requests: list[BenchRequest]) -> RunResult:
        start = time.perf_counter()
        traces: list[RequestTrace] = []
        num_generated = 0
        for request in sorted(requests, key=lambda request: request.arrival_s):
            wait_until(start + request.arrival_s)
            request_traces, num_tokens = generate_batch_traces(self._model, [request], start, self._pad_token_id)
            traces.extend(request_traces)
            num_generated += num_tokens
        return RunResult(self.key, self.label, workload, start, traces, num_generated)

    def close(self) -> None:
        pass


class StaticBatchGenerate:
    """(ii): when idle, everything that has arrived runs as one padded `generate`; then again, until all are done.

    A batch generates its longest request's output length for every row (static shapes), so only each row's own
    `num_output_tokens` count as useful; requests arriving meanwhile wait for the whole batch to end.
    """

    key = STATIC_KEY
    label = "(ii) HF generate, static padded batches"

    def __init__(self, model: PreTrainedModel, pad_token_id: int) -> None:
        self._model = model
        self._pad_token_id = pad_token_id

    def run(self, workload: str, requests: list[BenchRequest]) -> RunResult:
        start = time.perf_counter()
        pending = deque(sorted(requests, key=lambda request: request.arrival_s))
        traces: list[RequestTrace] = []
        num_generated = 0
        while pending:
            wait_until(start + pending[0].arrival_s)
            elapsed_s = time.perf_counter() - start
            batch = []
            while pending and pending[0].arrival_s <= elapsed_s:
                batch.append(pending.popleft())
            batch_traces, num_tokens = generate_batch_traces(self._model, batch, start, self._pad_token_id)
            traces.extend(batch_traces)
            num_generated += num_tokens
        return RunResult(self.key, self.label, workload, start, traces, num_generated)

    def close(self) -> None:
        pass


class StaticCacheGenerate:
    """(ii) with HF's static cache: every request of a workload as one padded `generate`, which on a GPU compiles
    the decoding step (torch.compile, reduce-overhead). The first run of each batch shape compiles, so every workload
    runs twice and the second is measured."""

    key = STATIC_KEY

    def __init__(self, model: PreTrainedModel, pad_token_id: int) -> None:
        self._model = model
        self._pad_token_id = pad_token_id
        compiled = " + torch.compile" if model.device.type == "cuda" else ""  # HF compiles on accelerators only
        self.label = f"(ii) HF generate, static cache{compiled}, batched"

    def run(self, workload: str, requests: list[BenchRequest]) -> RunResult:
        options = {"cache_implementation": "static"}
        generate_batch_traces(self._model, requests, time.perf_counter(), self._pad_token_id, **options)
        start = time.perf_counter()
        traces, num_generated = generate_batch_traces(self._model, requests, start, self._pad_token_id, **options)
        return RunResult(self.key, self.label, workload, start, traces, num_generated)

    def close(self) -> None:
        pass
