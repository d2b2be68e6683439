"""The model's forward under torch.compile, with our paged attention as one opaque custom op.

Eager, a decode step on CPU spends most of its time in the per-operator Python of HF's modules (norms, rotary
embedding, projections, residuals), not in their arithmetic. Compiled with dynamic shapes, everything but the
attention becomes one generated graph per distinct shape class. The attention cannot be traced: its metadata is
Python lists that change every step, and it writes the KV pool in place. So the graph calls
`steerbatch::paged_attention`, a custom op that declares the pool as mutated, and the op reads the step's
`PagedStep` from a thread-local that `compiled_forward` sets around the call.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request, RequestStatus
from worker.engine.attention.kv_pool import KVPool
from worker.engine.attention.paged_attention import paged_attention_at
from worker.engine.attention.paged_step import PagedStep
from worker.kernels.layer_variant import LayerVariant

logger = logging.getLogger(__name__)

_current = threading.local()


@contextmanager
def current_step(step: PagedStep, kv_pool: KVPool) -> Iterator[None]:
    """What the custom op attends with while the compiled forward runs on this thread."""
    _current.step, _current.kv_pool = step, kv_pool
    try:
        yield
    finally:
        _current.step = _current.kv_pool = None


# Defined on a torch.library.Library rather than with @custom_op: its per-call wrapper cost 22 us against 7 us.
_LIBRARY = torch.library.Library("steerbatch", "DEF")
_LIBRARY.define(
    "paged_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) kv_cache, int layer_idx, float scale, "
    "int sliding_window, float softcap, Tensor? sinks) -> Tensor"
)


def _paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    layer_idx: int,
    scale: float,
    sliding_window: int,  # 0: none
    softcap: float,  # 0: none
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """[N, H, D]: the step's attention output for layer `layer_idx`; writes the new K/V into `kv_cache` (the
    pool's tensor, passed so the compiler knows it changes)."""
    step, kv_pool = getattr(_current, "step", None), getattr(_current, "kv_pool", None)
    if step is None or kv_pool is None or kv_pool.cache is not kv_cache:
        raise RuntimeError("steerbatch::paged_attention called outside current_step() for this pool")
    variant = LayerVariant(scale, sliding_window or None, softcap or None, sinks)
    return paged_attention_at(layer_idx, query, key, value, variant, step, kv_pool)


_LIBRARY.impl("paged_attention", _paged_attention, "CompositeExplicitAutograd")


@torch.library.register_fake("steerbatch::paged_attention")
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    layer_idx: int,
    scale: float,
    sliding_window: int,
    softcap: float,
    sinks: torch.Tensor | None,
):
    return query.new_empty(query.shape[2], query.shape[1], query.shape[3])


CompiledLogits = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def compiled_forward(compiled: CompiledLogits, step: PagedStep, kv_pool: KVPool, is_warm: bool = False) -> torch.Tensor:
    """The logits [S, V] (float) at the step's logits indices, through the compiled model. Once `is_warm` (every
    shape class compiled: `warm_up`), Dynamo checks only the guards that tell those graphs apart."""
    with current_step(step, kv_pool), torch.compiler.set_stance(skip_guard_eval_unsafe=is_warm):
        logits = compiled(step.input_ids, step.position_ids, step.logits_indices, kv_pool.cache)
    return logits[0].float()


# The architecture compiled in this process (see compile_model); the guards cannot tell two apart.
_compiled_architecture: str | None = None


def compile_model(model: PreTrainedModel) -> CompiledLogits:
    """The model's logits under torch.compile with dynamic shapes; the compiling itself happens at the first calls.

    What is compiled is a function that returns only the logits tensor, not the model's output object: Dynamo then
    rebuilds no output object in Python after every step (3.56 -> 3.46 ms a 32-row step, alternating in one process).

    The weights and modules never change after loading (steered steps run eager, their hooks removed before the next
    compiled step), so the guards skip every module attribute, which saved 0.2 ms a step (checking them took 0.4 ms).
    The price: Dynamo would hand a second model of the same class but another shape the first one's graph, so a
    process compiles one architecture; another one is refused here rather than run wrong."""
    global _compiled_architecture
    settings = {key: value for key, value in model.config.to_dict().items() if key != "_name_or_path"}
    architecture = f"{type(model).__qualname__} {json.dumps(settings, sort_keys=True, default=str)}"
    if _compiled_architecture is not None and architecture != _compiled_architecture:
        raise ValueError("TORCH_COMPILE: this process already compiled a model of another architecture or shape")
    _compiled_architecture = architecture
    options = {
        "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
        "cpp_wrapper": True,  # the generated graph calls its kernels from C++, not from a Python function
    }

    def forward_logits(
        input_ids: torch.Tensor, position_ids: torch.Tensor, logits_indices: torch.Tensor, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        output = model(
            input_ids=input_ids,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=logits_indices,
            kv_cache=kv_cache,
        )
        return output.logits  # [1, S, V]

    return torch.compile(forward_logits, dynamic=True, options=options)


def warm_up(run: Callable[[Batch], object], kv_pool: KVPool) -> None:
    """Runs the shape classes a worker meets, so that they compile before it serves rather than in its first
    requests' steps: sizes of 0 and 1 get graphs of their own, so one decode row (1 token, 1 logit row), a prefill
    chunk (n tokens, 1 row), a prefill chunk that samples nothing (n tokens, no row: a long prompt's first chunks)
    and two decode rows (n tokens, n rows). The K/V go to blocks 0 and 1, which no request holds yet."""
    if kv_pool.block_size < 2 or kv_pool.num_blocks < 2:
        logger.warning("torch.compile: no warm-up with blocks of 1 token or a pool of 1 block; steps compile as met")
        return
    started = time.perf_counter()
    prefill_len = min(8, kv_pool.block_size)
    requests = [
        Request(f"warm-up-{i}", [0] * prefill_len, max_tokens=1, block_table=[i], status=RequestStatus.RUNNING)
        for i in range(2)
    ]
    for chunks in (
        [ScheduledChunk(requests[0], 0, prefill_len, is_sampling=True)],
        [ScheduledChunk(requests[1], 0, prefill_len, is_sampling=False)],
        [ScheduledChunk(requests[0], prefill_len - 1, 1, is_sampling=True)],
        [ScheduledChunk(request, prefill_len - 1, 1, is_sampling=True) for request in requests],
    ):
        run(Batch(chunks))
    logger.info("torch.compile: compiled the forward's shape classes in %.1fs", time.perf_counter() - started)
