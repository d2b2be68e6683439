"""gunicorn's own answers in OpenAI's error shape.

gunicorn answers a request it cannot hand to Flask itself: a request line over `limit_request_line` (414), too many
or too large header fields (431), a malformed request line or header (400), an unsupported transfer coding (501).
It writes those pages with `gunicorn.util.write_error`, which every worker class (gthread, gevent, sync) calls
through the module, and offers no setting or hook for them; so api/gunicorn_conf.py puts `write_json_error` in its
place, in the master before any worker forks."""

from __future__ import annotations

import json
import socket

from gunicorn import util


def json_error_response(status: int, reason: str, message: str) -> bytes:
    """The whole HTTP response: OpenAI's error object, and the connection closed after it as gunicorn's was."""
    error_type = "invalid_request_error" if status < 500 else "server_error"
    code = reason.lower().replace(" ", "_").replace("-", "_")
    body = json.dumps({"error": {"message": message or reason, "type": error_type, "param": None, "code": code}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"  # json.dumps wrote ASCII
    )
    return (head + body).encode("latin-1", errors="replace")


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """gunicorn.util.write_error's signature and job, in JSON."""
    util.write_nonblock(sock, json_error_response(status_int, reason, mesg))


def install() -> None:
    util.write_error = write_json_error
