"""Baseline (iii): HF's own continuous batching, the `ContinuousBatchingManager` under `model.generate_batch`.

`generate_batch` itself submits every prompt at once with one shared `max_new_tokens` and returns only at the end,
so the benchmark drives the manager it wraps (`model.init_continuous_batching`): `add_request` per request at its
arrival time, with its own `max_new_tokens` and `eos_token_id=-1` (EOS ignored), and `record_timestamps=True`, which
stamps `time.perf_counter()` in the manager's thread as each token is appended, the same clock as the other engines.

On CPU the manager sizes its paged KV cache from the machine's RAM unless told otherwise, and attends over a mask as
wide as the cache, so the cache is sized to what the workload needs (all its requests at once) and the per-step
token budget matches the engine's `max_num_batched_tokens`.
"""

from __future__ import annotations

import inspect
import logging
import math
import time

from transformers import GenerationConfig, PreTrainedModel

from bench.metrics import RequestTrace, RunResult
from bench.workload import BenchRequest, Feeder
from worker.kernels.openmp_pool import release_thread_pool

try:  # the manager's configuration as transformers 5.24 names it; a GPU machine may hold an older 5.x
    from transformers import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import ContinuousBatchingManager
    from transformers.generation.continuous_batching.utils import WorkloadHints
except ImportError:
    ContinuousBatchingConfig = None

logger = logging.getLogger(__name__)

PAGE_SIZE = 256  # HF's default
ARGUMENT_ALIASES = {"page_size": ("block_size",)}  # older 5.x spellings
NO_EOS = -1
RESULT_POLL_S = 1.0


def has_continuous_batching(model: PreTrainedModel) -> bool:
    return ContinuousBatchingConfig is not None and hasattr(model, "init_continuous_batching")


def size_config(requests: list[BenchRequest], max_batch_tokens: int, max_requests: int) -> ContinuousBatchingConfig:
    num_blocks = sum(
        math.ceil((len(request.prompt_token_ids) + request.num_output_tokens) / PAGE_SIZE) for request in requests
    )
    wanted = {
        "page_size": PAGE_SIZE,
        "num_blocks": num_blocks,
        "max_batch_tokens": max_batch_tokens,
        "max_requests_per_batch": max_requests,
    }
    return ContinuousBatchingConfig(**accepted_arguments(wanted))


def accepted_arguments(wanted: dict[str, int]) -> dict[str, int]:
    """`wanted` under the names this transformers' `ContinuousBatchingConfig` takes (5.17, on the GPU image, calls the
    page size `block_size`); a setting it has no name for is left at its default, with a warning."""
    accepted = set(inspect.signature(ContinuousBatchingConfig).parameters)
    arguments = {}
    for name, value in wanted.items():
        spelling = next((alias for alias in (name, *ARGUMENT_ALIASES.get(name, ())) if alias in accepted), None)
        if spelling is None:
            logger.warning("this transformers' ContinuousBatchingConfig takes no %s; its default stays", name)
            continue
        arguments[spelling] = value
    return arguments


def workload_hints(requests: list[BenchRequest]) -> WorkloadHints:
    return WorkloadHints(
        max_prompt_length=max(len(request.prompt_token_ids) for request in requests),
        max_generated_length=max(request.num_output_tokens for request in requests),
        num_requests=len(requests),
    )


class HFContinuousBatching:
    """(iii): one manager, started once and sized for `sizing_requests`, serves every workload run on it."""

    key = "hf_cb"
    label = "(iii) HF generate_batch (continuous batching)"

    def __init__(
        self,
        model: PreTrainedModel,
        sizing_requests: list[BenchRequest],
        max_batch_tokens: int,
        max_requests: int,
    ) -> None:
        self._manager: ContinuousBatchingManager = model.init_continuous_batching(
            generation_config=GenerationConfig(do_sample=False, eos_token_id=NO_EOS),
            continuous_batching_config=size_config(sizing_requests, max_batch_tokens, max_requests),
            workload_hints=workload_hints(sizing_requests),
        )
        # The condition our engine starts in: the loading thread's OpenMP team handed back, so that the manager's
        # thread is not the one whose team sleeps between parallel regions (worker/kernels/openmp_pool.py)
        release_thread_pool()
        self._manager.start()

    def run(self, workload: str, requests: list[BenchRequest]) -> RunResult:
        start = time.perf_counter()
        feeder = Feeder(requests, start, self._submit)
        outputs = {}
        while len(outputs) < len(requests):
            feeder.check()
            output = self._manager.get_result(timeout=RESULT_POLL_S)
            if output is None and not self._manager.is_running():
                raise RuntimeError("HF's continuous batching thread ended before the workload finished")
            if output is not None and output.is_finished():
                if output.error is not None:
                    raise RuntimeError(f"HF continuous batching failed {output.request_id}: {output.error}")
                outputs[output.request_id] = output
        feeder.join()
        traces = [
            RequestTrace(
                request.request_id,
                start + request.arrival_s,
                outputs[request.request_id].generated_tokens,
                outputs[request.request_id].timestamps or [],
            )
            for request in requests
        ]
        num_generated = sum(len(trace.token_ids) for trace in traces)
        return RunResult(self.key, self.label, workload, start, traces, num_generated)

    def _submit(self, request: BenchRequest) -> None:
        self._manager.add_request(
            request.prompt_token_ids,
            request_id=request.request_id,
            max_new_tokens=request.num_output_tokens,
            record_timestamps=True,
            eos_token_id=NO_EOS,
        )

    def close(self) -> None:
        self._manager.stop(block=True)
        self._manager.destroy()
