"""HF `transformers serve` as the service benchmark's peer: the same model folder served by Hugging Face's own
OpenAI-compatible server with continuous batching on, measured by the same lean asyncio client as the service.

The peer is started here, on a free port, with the engine's torch threads (OMP_NUM_THREADS / MKL_NUM_THREADS, which
torch reads at start). It needs `transformers[serving]` (FastAPI, uvicorn; the dev extra installs them); where they are
missing the bench says so and goes on without it.

What the peer's API cannot say, and how it is measured instead:
- Its /v1/completions takes a text prompt only, so each prompt's token ids are decoded to text and the peer tokenizes
  them again (the prompt it reports in usage may differ from the original by a few tokens).
- `ignore_eos` is not a field it knows: each request carries a `generation_config` with `eos_token_id: -1` and greedy
  decoding, so every request yields exactly its max_tokens, as with the service.
- It streams text, not token ids, and sends a chunk only when a token adds text: the first token's time is its first
  chunk with text (or its final chunk, where no token added text), later than the first token whenever that token
  decodes to nothing. The peer's TTFT is therefore an upper bound. Tokens are counted from usage.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from transformers import PreTrainedTokenizerFast

from bench.service.batch_stack import free_port
from bench.service.http_stream import StreamResponse
from bench.service.sse_client import StreamClient, StreamTiming
from bench.workload import BenchRequest

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # loading the model and starting uvicorn on a busy 2-core machine
STOP_TIMEOUT_S = 20.0  # its shutdown waits for the continuous-batching thread
SERVING_MODULES = ("fastapi", "uvicorn", "starlette", "openai")
KV_BLOCK_TOKENS = 32


def peer_missing() -> str | None:
    """Why `transformers serve` cannot run here, or None when it can."""
    missing = [name for name in SERVING_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        return f"transformers serve needs {', '.join(missing)} (pip install -e '.[dev]' installs transformers[serving])"
    return None


@dataclass(frozen=True)
class PeerServer:
    base_url: str
    model: str
    log_path: Path


@contextmanager
def running_peer(model: str, threads: int, max_batch_tokens: int, kv_tokens: int) -> Iterator[PeerServer]:
    """`transformers serve --continuous-batching` on `model` (preloaded), on CPU, until the block ends, with the
    engine's token budget per step and a KV cache for twice `kv_tokens` (left to itself on CPU, it sizes the cache from
    the machine's free memory: 14 GB for the tiny model, and the kernel's OOM killer ended it)."""
    port = free_port()
    num_blocks = 2 * -(-kv_tokens // KV_BLOCK_TOKENS) + 16
    log_path = Path(tempfile.mkdtemp(prefix="steerbatch-bench-peer-")) / "transformers-serve.log"
    # the console script's own entry point, so that the peer runs in this interpreter's environment
    command = [
        sys.executable,
        "-c",
        "from transformers.cli.transformers import main; main()",
        "serve",
        "--continuous-batching",
        "--cb-block-size",
        str(KV_BLOCK_TOKENS),
        "--cb-num-blocks",
        str(num_blocks),
        "--cb-max-batch-tokens",
        str(max_batch_tokens),
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        model,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = PeerServer(f"http://127.0.0.1:{port}", model, log_path)
    try:
        _wait_until_ready(process, server)
        logger.info("peer (transformers serve) up at %s (log %s)", server.base_url, log_path)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_ready(process: subprocess.Popen, server: PeerServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = server.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"transformers serve exited with {process.returncode}: {tail}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200 and _first_completion(server):
                return
        except httpx.HTTPError as exc:
            logger.debug("peer not ready yet: %s", exc)
        time.sleep(0.5)
    raise RuntimeError(f"transformers serve not ready after {READY_TIMEOUT_S:.0f} s (log {server.log_path})")


def _first_completion(server: PeerServer) -> bool:
    """One small completion, since the peer starts its continuous-batching thread (seconds, on a busy machine) on the
    first request: ready means that is done."""
    body = {"model": server.model, "prompt": "warm-up", "max_tokens": 2, "temperature": 0}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=READY_TIMEOUT_S)
    return response.status_code == 200


class PeerStreamClient(StreamClient):
    """The bench's client, speaking the peer's dialect of /v1/completions (text prompts, text chunks)."""

    def __init__(self, server: PeerServer, requests: list[BenchRequest]) -> None:
        super().__init__(server.base_url, "unused", server.model)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(server.model)
        self._prompts = {request.request_id: tokenizer.decode(request.prompt_token_ids) for request in requests}

    def request_body(self, request: BenchRequest) -> dict:
        generation = {"do_sample": False, "eos_token_id": -1, "max_new_tokens": request.num_output_tokens}
        return {
            "model": self._model,
            "prompt": self._prompts[request.request_id],
            "max_tokens": request.num_output_tokens,
            "temperature": 0,
            "stream": True,
            "generation_config": json.dumps(generation),
        }

    async def read_stream(self, response: StreamResponse, request: BenchRequest, start: float) -> StreamTiming:
        first_text_at, num_tokens = None, None
        async for line in response.lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                raise RuntimeError(f"peer, {request.request_id}: {chunk['error']}")
            if chunk.get("usage"):
                num_tokens = chunk["usage"]["completion_tokens"]
                if first_text_at is None:
                    # no token added text: the first thing the peer showed is its last chunk
                    logger.warning("peer, %s: no chunk with text; TTFT is the final chunk's", request.request_id)
                    first_text_at = time.perf_counter() - start
            elif first_text_at is None and any(choice.get("text") for choice in chunk.get("choices", ())):
                first_text_at = time.perf_counter() - start
        if first_text_at is None or num_tokens != request.num_output_tokens:
            raise RuntimeError(f"peer, {request.request_id}: usage {num_tokens}, expected {request.num_output_tokens}")
        return StreamTiming(num_tokens, first_text_at)
