"""A non-streamed client that hangs up cancels its request, as a streamed one does: nobody will read the result,
so the engine stops generating it."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import sqlalchemy

from scripts.stack import Stack
from tests.service.http import auth


def newest_request(database_url: str) -> tuple[str, str] | None:
    engine = sqlalchemy.create_engine(database_url)
    try:
        with engine.connect() as connection:
            query = "SELECT id, status FROM requests ORDER BY created DESC, id LIMIT 1"
            row = connection.execute(sqlalchemy.text(query)).first()
            return None if row is None else (row[0], row[1])
    finally:
        engine.dispose()


def test_a_non_streamed_client_that_hangs_up_cancels_its_request(stack: Stack) -> None:
    before = newest_request(stack.config.database_url)
    body = json.dumps({"model": stack.config.model_name, "prompt": "the cat", "max_tokens": 4000, "ignore_eos": True})
    url = urlparse(stack.base_url)
    headers = {**auth(stack), "Content-Type": "application/json", "Content-Length": str(len(body))}
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection((url.hostname, url.port)) as client:
        client.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n{head}\r\n{body}".encode())
        deadline = time.monotonic() + 30
        while (newest := newest_request(stack.config.database_url)) in (before, None) or newest[1] != "running":
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.1)
    request_id = newest[0]
    deadline = time.monotonic() + 30  # noticed at the next idle check (SSE_HEARTBEAT_S), then cancelled in a step
    while (status := dict([newest_request(stack.config.database_url)])[request_id]) == "running":
        assert time.monotonic() < deadline, "the request ran on after its client left"
        time.sleep(0.2)
    assert status == "cancelled"
