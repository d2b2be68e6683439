"""A non-streamed client that hangs up cancels its request at once: nothing can resume a non-streamed answer, so
the engine stops generating it (a streamed one has STREAM_RESUME_GRACE_S to come back first)."""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlparse

import sqlalchemy

from scripts.stack import Stack
from tests.service.http import auth


def status_of_prompt(database_url: str, prompt: str) -> str | None:
    """The status of the request whose body holds `prompt` (the stack's other tests share its database)."""
    engine = sqlalchemy.create_engine(database_url)
    try:
        with engine.connect() as connection:
            query = sqlalchemy.text("SELECT status FROM requests WHERE CAST(body AS TEXT) LIKE :pattern")
            return connection.execute(query, {"pattern": f"%{prompt}%"}).scalar_one_or_none()
    finally:
        engine.dispose()


def test_a_non_streamed_client_that_hangs_up_cancels_its_request(stack: Stack) -> None:
    prompt = f"the cat {uuid.uuid4().hex}"
    body = json.dumps({"model": stack.config.model_name, "prompt": prompt, "max_tokens": 4000, "ignore_eos": True})
    url = urlparse(stack.base_url)
    headers = {**auth(stack), "Content-Type": "application/json", "Content-Length": str(len(body))}
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection((url.hostname, url.port)) as client:
        client.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n{head}\r\n{body}".encode())
        deadline = time.monotonic() + 60
        while status_of_prompt(stack.config.database_url, prompt) != "running":
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.1)
    deadline = time.monotonic() + 30  # noticed within SSE_HEARTBEAT_S, then cancelled in a step
    while (status := status_of_prompt(stack.config.database_url, prompt)) == "running":
        assert time.monotonic() < deadline, "the request ran on after its client left"
        time.sleep(0.2)
    assert status == "cancelled"
