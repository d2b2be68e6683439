"""What the Batch API benchmarks share: a stack of real processes on a throwaway database, prompts, and batches
submitted and awaited through the `openai` client."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from openai import OpenAI
from openai.types import Batch
from transformers import PreTrainedTokenizerFast

from bench.workload import BenchRequest, WorkloadSpec, make_workload
from scripts.stack import Stack, launcher_key, sigterm_as_interrupt
from tasks.config import Config

logger = logging.getLogger(__name__)


def bench_config(model: str, database_url: str | None = None, **overrides: object) -> Config:
    """The environment's Config on `database_url` (default: a fresh SQLite file), with keys and queues no other run
    shares."""
    run = uuid.uuid4().hex[:8]
    database = Path(tempfile.mkdtemp(prefix="steerbatch-bench-")) / "bench.db"
    return dataclasses.replace(
        Config.from_env(),
        model=model,
        database_url=database_url or f"sqlite:///{database}",
        redis_prefix=f"bench-{run}:",
        interactive_queue=f"bench-{run}-interactive",
        bulk_queue=f"bench-{run}-bulk",
        port=free_port(),
        **overrides,  # type: ignore[arg-type]
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_stack(config: Config) -> Iterator[Stack]:
    """The stack, stopped however the bench ends, a SIGTERM included: its processes run in sessions of their own, so
    a bench killed without stopping them would leave them running, and their CPU in every measurement after it."""
    log_dir = Path(tempfile.mkdtemp(prefix="steerbatch-bench-logs-"))
    stack = Stack(config, log_dir=log_dir, api_key=launcher_key(config, f"bench-{config.redis_prefix.strip(':')}"))
    with sigterm_as_interrupt():
        try:
            stack.start()
            logger.info("stack up at %s (logs in %s)", stack.base_url, stack.log_dir)
            yield stack
        finally:
            stack.stop()


def client_for(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, timeout=600)


def random_prompts(config: Config, spec: WorkloadSpec) -> list[BenchRequest]:
    """Random token-id prompts with exact lengths; EOS is ignored, so each generates exactly its output length."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(config.model)
    return make_workload("bench", spec, len(tokenizer), set(tokenizer.all_special_ids), poisson_rate_per_s=None)


def completion_lines(config: Config, requests: list[BenchRequest]) -> bytes:
    lines = []
    for request in requests:
        body = {
            "model": config.model_name,
            "prompt": request.prompt_token_ids,
            "temperature": 0,
            "max_tokens": request.num_output_tokens,
            "ignore_eos": True,
        }
        lines.append({"custom_id": request.request_id, "method": "POST", "url": "/v1/completions", "body": body})
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def create_batch(stack: Stack, content: bytes) -> Batch:
    client = client_for(stack)
    upload = client.files.create(file=("bench.jsonl", content), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")


def wait_for_end(stack: Stack, batch_id: str) -> Batch:
    """Follow the batch's progress events to its end (no polling to load the api), then read it."""
    url = f"{stack.base_url}/v1/batches/{batch_id}/events"
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with requests.get(url, headers=headers, stream=True, timeout=600) as response:
        for line in response.iter_lines(decode_unicode=True):
            if line == "data: [DONE]":
                break
    return client_for(stack).batches.retrieve(batch_id)
