"""Loads the HF causal LM once, allocates the KV pool, and runs one packed forward pass per engine step."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, PreTrainedModel

from scheduler.batch import Batch, ScheduledChunk
from steering.batch_hooks import BatchHooks
from steering.hook_points import point_width
from steering.model_layout import ModelLayout
from tasks.config import Config
from tasks.messages.steering import MonitoredPosition
from worker.engine.attention.backend import AttentionBackend, resolve_attention_backend
from worker.engine.attention.kv_pool import KVPool, KVShape, num_pool_tokens
from worker.engine.attention.paged_attention import FLASH_BACKEND, PAGED_BACKEND, register_paged_attention
from worker.engine.attention.paged_step import PagedStep, build_paged_step
from worker.engine.compiled_forward import CompiledLogits, compile_model, compiled_forward, warm_up
from worker.engine.graphs.graph_mode import GraphMode, graph_mode_for_model, resolve_graph_mode
from worker.engine.loading.cpu_weight_layout import store_linear_weights_column_major
from worker.engine.loading.model_support import check_model_supported
from worker.engine.loading.target_weights import load_target_weights
from worker.engine.sampling.sampler import Argmax, torch_argmax
from worker.engine.speculation.draft_weights import load_draft_weights
from worker.engine.transfers import to_device
from worker.kernels.cpu_decode_kernel import CpuDecodeKernel, load_cpu_decode_kernel
from worker.kernels.kv_quant import KVCacheDtype, resolve_kv_cache_dtype
from worker.steering.request_sae import RequestSAE
from worker.steering.sae_attachments import SAEAttachments
from worker.steering.steering_plan import build_step_plan, read_monitored
from worker.steering.worker_monitor import WorkerMonitor

if TYPE_CHECKING:
    from worker.engine.graphs.cuda_graphs import DecodeGraphs

logger = logging.getLogger(__name__)

SDPA_BLOCK_SIZE = 16
FLASH_BLOCK_SIZE = 256  # flash-attn 2 requires paged KV blocks of a multiple of 256 tokens
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """DTYPE `name`; auto: bfloat16 on a CUDA device that computes in it natively (Ampere on), float16 on older ones,
    float32 on CPU."""
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_attention_backend(
    config: Config, device: torch.device, dtype: torch.dtype
) -> tuple[AttentionBackend, CpuDecodeKernel | None]:
    """ATTENTION_BACKEND on `device` in `dtype`, with the C decode kernel when that is the backend; sdpa instead when
    the kernel cannot be built (load_cpu_decode_kernel warns why)."""
    backend = resolve_attention_backend(config.attention_backend, device, dtype)
    if backend is not AttentionBackend.CPU_KERNEL:
        return backend, None
    kernel = load_cpu_decode_kernel()
    return (backend, kernel) if kernel is not None else (AttentionBackend.SDPA, None)


@dataclass(frozen=True)
class StepOutput:
    logits: torch.Tensor  # [S, V] float: one row per sampling chunk
    monitored: dict[str, list[MonitoredPosition]]  # by request id: positions its monitor read this step
    prompt_logits: torch.Tensor | None = None  # [P, V] float at the step's prompt_indices, when it had some


def read_eos_token_ids(model: PreTrainedModel) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model.generation_config, model.config):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(token_id) for token_id in value)
    return frozenset(ids)


class ModelRunner:
    """Owns the model and the KV pool on one device; every method must be called from the engine thread."""

    def __init__(self, config: Config) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cpu" and config.cpu_threads > 0:
            torch.set_num_threads(config.cpu_threads)
        register_paged_attention()
        self.attention_backend, cpu_kernel = load_attention_backend(config, self.device, self.dtype)
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype)
        if self.kv_cache_dtype.is_quantized and self.is_flash:
            raise ValueError(
                f"KV_CACHE_DTYPE={self.kv_cache_dtype.value}: flash-attn's paged kernel reads only the model's dtype; "
                "use ATTENTION_BACKEND=triton"
            )
        graph_mode = resolve_graph_mode(config.cuda_graphs, self.device, self.attention_backend)
        # one registered function serves sdpa, cpu_kernel and triton: it goes by the metadata each step carries
        hf_attention = FLASH_BACKEND if self.is_flash else PAGED_BACKEND
        started = time.perf_counter()
        model_config = AutoConfig.from_pretrained(config.model)
        graph_mode = graph_mode_for_model(graph_mode, model_config)
        self.max_model_len = config.max_model_len or int(model_config.max_position_embeddings)
        check_model_supported(  # before any weights load
            config.model, model_config, self.max_model_len, self.attention_backend, self.device.type
        )
        self.model, self.quantization = load_target_weights(
            config.model, model_config, config.quantization, self.device, self.dtype, hf_attention
        )
        self.eos_token_ids = read_eos_token_ids(self.model)
        self.draft_model: PreTrainedModel | None = None  # SPECULATIVE_DRAFT_MODEL's, with its own pool of our blocks
        if config.speculative_draft_model:
            draft = config.speculative_draft_model
            check_model_supported(
                draft, AutoConfig.from_pretrained(draft), self.max_model_len, self.attention_backend, self.device.type
            )
            self.draft_model = load_draft_weights(
                config.speculative_draft_model,
                self.model.config,
                self.device,
                self.dtype,
                hf_attention,
                self.max_model_len,
            )
        if self.device.type == "cpu" and torch.backends.mkl.is_available():  # measured with MKL's GEMMs only
            for model in (self.model, self.draft_model):
                if model is not None:
                    store_linear_weights_column_major(model)
        self.kv_pool, self.draft_kv_pool = self._allocate_kv_pools(config, cpu_kernel, graph_mode is not None)
        kernel = self.kv_pool.decode_kernel
        self.argmax: Argmax = kernel.argmax if kernel is not None else torch_argmax  # of the logits run() returns
        layout = ModelLayout.of(self.model)
        self.saes = SAEAttachments(layout, config, self.device, self.dtype)
        self._hooks = BatchHooks(layout)
        self._compiled: CompiledLogits | None = None
        self._is_compiled_warm = False
        self._graphs: DecodeGraphs | None = None  # run() asks before they are loaded: the compiled warm-up runs steps
        if config.torch_compile and self.device.type == "cpu":  # measured on CPU only; CUDA would want CUDA graphs
            self._compiled = compile_model(self.model)
            warm_up(self.run, self.kv_pool)
            self._is_compiled_warm = True
        elif config.torch_compile:
            logger.warning("TORCH_COMPILE is for CPU workers; this %s worker runs eager", self.device.type)
        if graph_mode is not None:
            self._graphs = self._load_decode_graphs(config.max_num_seqs, graph_mode)
        logger.info(
            "loaded %s on %s as %s, quantization %s: %.1fM parameters in %.1fs, max_model_len %d, eos %s, attention %s",
            config.model,
            self.device,
            self.dtype,
            self.quantization.name,
            self.model.num_parameters() / 1e6,
            time.perf_counter() - started,
            self.max_model_len,
            sorted(self.eos_token_ids),
            self.attention_backend.value,
        )

    @property
    def graph_mode(self) -> GraphMode | None:
        """How decode steps run through DecodeGraphs; None: every step eager."""
        return None if self._graphs is None else self._graphs.mode

    @property
    def hooks(self) -> BatchHooks:
        """The SAE hooks every forward pass on the engine thread shares (the embedding forwards steer through them)."""
        return self._hooks

    @property
    def kv_cache_dtype_name(self) -> str:
        """What the KV pool holds: "int8" or "fp8_e4m3" codes, or the model's dtype ("float32", "bfloat16")."""
        if self.kv_cache_dtype is KVCacheDtype.AUTO:
            return str(self.dtype).removeprefix("torch.")
        return self.kv_cache_dtype.value

    @property
    def is_flash(self) -> bool:
        return self.attention_backend is AttentionBackend.FLASH_ATTN

    def _allocate_kv_pools(
        self, config: Config, kernel: CpuDecodeKernel | None, has_scratch_block: bool
    ) -> tuple[KVPool, KVPool | None]:
        """The target's pool (with a scratch block for decode graphs' padding rows when asked) and, with a draft
        model, the draft's: the same blocks (a request's block table addresses both), sized together so that both
        fit."""
        block_size = config.kv_block_size or (FLASH_BLOCK_SIZE if self.is_flash else SDPA_BLOCK_SIZE)
        if self.is_flash and block_size % FLASH_BLOCK_SIZE:
            raise ValueError(f"flash-attn's paged kernels need KV_BLOCK_SIZE to be a multiple of {FLASH_BLOCK_SIZE}")
        shapes = [KVShape.of(model.config) for model in (self.model, self.draft_model) if model is not None]
        bytes_per_token = sum(shape.bytes_per_token(self.dtype, self.kv_cache_dtype) for shape in shapes)
        num_tokens = num_pool_tokens(config, bytes_per_token, self.device, self.max_model_len)
        num_blocks = num_tokens // block_size
        if num_blocks < 1:
            raise ValueError(f"the KV pool holds {num_tokens} tokens, less than one block of {block_size}")
        is_heads_major = not self.is_flash
        pool_of = partial(KVPool, num_blocks=num_blocks, block_size=block_size, dtype=self.dtype, device=self.device)
        pools = [
            pool_of(
                shape,
                is_heads_major=is_heads_major,
                decode_kernel=kernel,
                has_scratch_block=is_scratched,
                kv_dtype=self.kv_cache_dtype,
            )
            for shape, is_scratched in zip(shapes, (has_scratch_block, False), strict=False)  # the target's only
        ]
        logger.info(
            "KV pool: %d blocks of %d tokens (%d tokens, %.1f MiB, the draft's included), KV cache dtype %s: %d bytes "
            "a token",
            num_blocks,
            block_size,
            num_blocks * block_size,
            sum(pool.num_bytes for pool in pools) / 2**20,
            self.kv_cache_dtype_name,
            bytes_per_token,
        )
        return pools[0], pools[1] if len(pools) > 1 else None

    def _load_decode_graphs(self, max_num_seqs: int, mode: GraphMode) -> DecodeGraphs:
        """Decode steps over static buffers for up to `max_num_seqs` rows, captured now (CAPTURE)."""
        from worker.engine.attention.triton_step import num_sms
        from worker.engine.graphs.cuda_graphs import DecodeGraphs  # imports triton: only on workers that run it
        from worker.engine.graphs.decode_buffers import DecodeBuffers
        from worker.engine.graphs.graph_hooks import GraphHookBuffers
        from worker.kernels.triton_decode import num_decode_splits

        pool, max_len = self.kv_pool, self.max_model_len
        buffers = DecodeBuffers(pool, max_num_seqs, -(-max_len // pool.block_size), self.device)
        layout = self._hooks.layout
        hook_buffers = GraphHookBuffers(partial(point_width, layout), max_num_seqs, self.dtype, self.device)
        graphs = DecodeGraphs(
            lambda step: paged_forward(self.model, step, pool),
            self._hooks,
            buffers,
            hook_buffers,
            # fixed per bucket, for the longest context: short rows leave some splits empty, which cost little
            lambda bucket: num_decode_splits(bucket, pool.num_kv_heads, max_len, num_sms(self.device)),
            mode,
        )
        with torch.inference_mode():
            graphs.warm_up()
        return graphs

    @torch.inference_mode()
    def run(
        self,
        batch: Batch,
        rows: Sequence[RequestSAE | None] | None = None,
        worker_monitor: WorkerMonitor | None = None,
        prompt_indices: Sequence[int] = (),
    ) -> StepOutput:
        """One forward pass over every scheduled chunk, with each chunk's request's steering and monitor (`rows`,
        one per chunk; None: none steer or monitor) and the worker-wide monitor carried out by the SAE hooks; the
        logits at the packed tokens `prompt_indices` are kept too, for prompt logprobs."""
        rows = [None] * len(batch.chunks) if rows is None else rows
        if self._graphs is not None and not prompt_indices and self._graphs.fits(batch.chunks):
            return self._run_graph(batch.chunks, rows, worker_monitor)
        step = build_paged_step(batch, self.kv_pool, self.device, self.attention_backend)
        num_sampling = step.logits_indices.shape[0]
        if prompt_indices:
            extra = to_device(prompt_indices, torch.int64, self.device)
            step = dataclasses.replace(step, logits_indices=torch.cat([step.logits_indices, extra]))
        plan, slices = build_step_plan(batch.chunks, step.token_rows, rows, worker_monitor, self.dtype)
        if plan is not None:
            self._hooks.set_step(plan)
        try:
            if self._compiled is not None and plan is None and not prompt_indices:
                self._hooks.close()  # the graph is traced without hooks, and its guards skip modules: leave it none
                logits = compiled_forward(self._compiled, step, self.kv_pool, self._is_compiled_warm)
            else:
                logits = paged_forward(self.model, step, self.kv_pool)
            results = self._hooks.take_monitor_results()
        finally:
            self._hooks.clear()
        prompt_logits = logits[num_sampling:] if prompt_indices else None
        return StepOutput(logits[:num_sampling], read_monitored(results, slices), prompt_logits)

    def _run_graph(
        self, chunks: list[ScheduledChunk], rows: Sequence[RequestSAE | None], worker_monitor: WorkerMonitor | None
    ) -> StepOutput:
        """A decode-only step through its bucket's graph; the hooks' plan is built as for an eager step, and the
        graph carries it out through its static buffers."""
        token_rows = self._graphs.buffers.row_index[: len(chunks)]  # [B]: decode row i is packed token i
        plan, slices = build_step_plan(chunks, token_rows, rows, worker_monitor, self.dtype)
        logits, results = self._graphs.run(chunks, plan)
        return StepOutput(logits, read_monitored(results, slices))


def paged_forward(model: PreTrainedModel, step: PagedStep, kv_pool: KVPool) -> torch.Tensor:
    """The logits [S, V] (float) at the step's logits indices; our attention reads and writes `kv_pool`."""
    output = model(
        input_ids=step.input_ids,
        position_ids=step.position_ids,
        use_cache=False,
        logits_to_keep=step.logits_indices,
        paged_step=step,
        kv_pool=kv_pool,
    )
    return output.logits[0].float()
