"""What crosses the pipes between the worker and its engine process: one JSON object a message, `kind` naming it."""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any

# worker -> engine process
SUBMIT, CANCEL, EMBED, STOP = "submit", "cancel", "embed", "stop"
# engine process -> worker
READY, FAILED, STEP = "ready", "failed", "step"


def send(connection: Connection, kind: str, **fields: Any) -> None:
    connection.send_bytes(json.dumps({"kind": kind, **fields}, separators=(",", ":")).encode())


def receive(connection: Connection) -> dict[str, Any]:
    """The next message; raises EOFError once the other end has closed."""
    return json.loads(connection.recv_bytes())
