"""File content streams from the database a slice at a time: many slow downloads of a large file at once leave the
api's memory nearly where it was, and each gets every byte."""

from __future__ import annotations

import hashlib
import logging
import time
from contextlib import ExitStack

import psutil
import requests

from scripts.stack import Stack
from tests.service.http import auth

logger = logging.getLogger(__name__)
FILE_MB = 24
NUM_DOWNLOADS = 8


def api_rss_mb(stack: Stack) -> float:
    """Resident memory of the api: gunicorn's master and its workers."""
    master = psutil.Process(stack.process("api").popen.pid)
    return sum(process.memory_info().rss for process in (master, *master.children(recursive=True))) / 2**20


def health_ms(stack: Stack) -> float:
    started = time.perf_counter()
    assert requests.get(f"{stack.base_url}/health", timeout=10).status_code == 200
    return (time.perf_counter() - started) * 1000


def test_concurrent_downloads_of_a_large_file_hold_a_slice_each(stack: Stack) -> None:
    line = b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    content = line * (FILE_MB * 2**20 // len(line))
    upload = requests.post(
        f"{stack.base_url}/v1/files",
        headers=auth(stack),
        files={"file": ("big.jsonl", content)},
        data={"purpose": "batch"},
        timeout=120,
    )
    assert upload.status_code == 200, upload.text
    url = f"{stack.base_url}/v1/files/{upload.json()['id']}/content"
    rss_before_mb = api_rss_mb(stack)
    with ExitStack() as downloads:
        responses = [downloads.enter_context(requests.get(url, headers=auth(stack), stream=True, timeout=60))
                     for _ in range(NUM_DOWNLOADS)]  # fmt: skip
        readers = [response.iter_content(2**16) for response in responses]
        heads = [next(reader) for reader in readers]  # every download started, none finished: slow readers
        time.sleep(0.5)
        growth_mb = api_rss_mb(stack) - rss_before_mb
        slowest_health_ms = max(health_ms(stack) for _ in range(10))
        for response, head, reader in zip(responses, heads, readers, strict=True):
            assert response.headers["Content-Length"] == str(len(content))
            body = head + b"".join(reader)
            assert hashlib.sha256(body).digest() == hashlib.sha256(content).digest()
    logger.info(
        "%d downloads of a %d MB file held open: api RSS +%.0f MB, slowest /health %.0f ms",
        NUM_DOWNLOADS, FILE_MB, growth_mb, slowest_health_ms,
    )  # fmt: skip
    assert growth_mb < FILE_MB * NUM_DOWNLOADS / 4, f"the api grew {growth_mb:.0f} MB"
