"""A client polling a batch every few seconds over one pooled connection keeps it: the api's keep-alive outlasts a
poll interval (gunicorn's default, 2 s, closed the connection as a 2 s poller reused it, and a client without retries
failed)."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, submit, wait_for_end
from tests.service.http import auth

POLL_INTERVAL_S = 3.0  # longer than gunicorn's default keep-alive


def test_a_batch_poller_keeps_its_connection(stack: Stack) -> None:
    batch_id = submit(stack, [chat_line(stack, "only", max_tokens=2)])
    wait_for_end(stack, batch_id)
    address = urlsplit(stack.base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    connection.connect()
    first_socket = connection.sock
    for _ in range(3):
        connection.request("GET", f"/v1/batches/{batch_id}", headers=auth(stack))
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["id"] == batch_id
        time.sleep(POLL_INTERVAL_S)
    assert connection.sock is first_socket  # every poll went over the one connection
    connection.close()
