"""The api's access log names each request's method, path and status, and never a key: not the Authorization header,
and not a key a client put in the query string or the referer."""

from __future__ import annotations

import time
import uuid

import requests

from scripts.stack import Stack


def test_a_key_in_the_query_string_stays_out_of_the_access_log(stack: Stack) -> None:
    secret = f"sk-{uuid.uuid4().hex}"
    path = f"/v1/files/file-{uuid.uuid4().hex}"  # found in the log by its path: a 404 or 401, either is logged
    headers = {"Referer": f"https://example.com/?api_key={secret}"}
    requests.get(f"{stack.base_url}{path}?api_key={secret}", headers=headers, timeout=10)
    log_path = stack.process("api").log_path
    assert log_path is not None
    deadline = time.monotonic() + 10
    while path not in (log := log_path.read_text(errors="replace")):
        assert time.monotonic() < deadline, "the request never reached the access log"
        time.sleep(0.1)
    assert secret not in log
