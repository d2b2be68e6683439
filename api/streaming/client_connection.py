"""Whether the client of the current request has hung up, for a handler that writes nothing until it is done (a
non-streamed completion): a socket that reads as closed, without consuming anything the client sent."""

from __future__ import annotations

import select
import socket

from flask import request


def is_client_gone() -> bool:
    """True once the peer closed its end; False while it is connected or when the server gives no socket to ask
    (Flask's test client)."""
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:  # reset by the peer, or already closed
        return True
