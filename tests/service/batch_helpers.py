"""Building, submitting and awaiting batches against a running stack, for the service tests."""

from __future__ import annotations

import json
import time

from openai import OpenAI

from scripts.stack import Stack

CHAT_URL = "/v1/chat/completions"
TERMINAL = ("completed", "failed", "expired", "cancelled")


def client_for(stack: Stack, key: str | None = None) -> OpenAI:
    """A client sending `key`, by default the stack's admin key (tenant "default")."""
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=key or stack.api_key, max_retries=0, timeout=120)


def chat_line(stack: Stack, custom_id: str, content: str = "name a color", **body: object) -> dict:
    body = {
        "model": stack.config.model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        "temperature": 0,
        **body,
    }
    return {"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": body}


def submit(stack: Stack, lines: list[dict], endpoint: str = CHAT_URL, key: str | None = None) -> str:
    client = client_for(stack, key)
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    input_file = client.files.create(file=("input.jsonl", content), purpose="batch")
    return client.batches.create(input_file_id=input_file.id, endpoint=endpoint, completion_window="24h").id  # type: ignore[arg-type]


def wait_until(stack: Stack, batch_id: str, is_done, timeout_s: float = 120.0, key: str | None = None):  # type: ignore[no-untyped-def]
    client = client_for(stack, key)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if is_done(batch):
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} is still {batch.status}: {batch.request_counts}")


def wait_for_end(stack: Stack, batch_id: str, timeout_s: float = 120.0, key: str | None = None):  # type: ignore[no-untyped-def]
    return wait_until(stack, batch_id, lambda batch: batch.status in TERMINAL, timeout_s, key)


def read_jsonl(stack: Stack, file_id: str | None, key: str | None = None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client_for(stack, key).files.content(file_id).content.splitlines()]
