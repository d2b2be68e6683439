"""Gunicorn's settings for the api, from the one Config (`gunicorn -c python:api.gunicorn_conf 'api.app:create_app()'`).

Its `on_starting` hook runs in the master before any socket is bound: with no API key anywhere, an address that is
not loopback makes it exit non-zero with the reason (gunicorn prints a RuntimeError's message and exits 1)."""

from __future__ import annotations

from typing import Any

from api.gate.exposure import check_exposure
from api.gunicorn_errors import install as install_json_errors
from api.observability.api_metrics import clear_multiprocess_dir
from tasks.config import Config
from tasks.logs import configure_logging

_config = Config.from_env()

bind = [f"{_config.host}:{_config.port}"]
# gevent: an open SSE stream waits on its socket in a greenlet, not a thread, so one process holds thousands of them
# and /health still answers at once (with 64 threads the 65th stream, and /health, waited).
worker_class = "gevent"
worker_connections = _config.api_connections
workers = 1
graceful_timeout = 5
# How long a connection may wait for its next request to be read, its first one included (gunicorn's async workers
# time the first read too). Gunicorn's 2 s default closed connections that a burst kept the busy event loop from
# reading in time: the client saw the connection close (or reset, with its request unread) and no answer at all.
keepalive = 30
accesslog = "-"
# gunicorn's default format without the query string and the referer (both URLs a client may have put a key in, as
# `?api_key=`): method, path, protocol, status, size, user agent; never the Authorization header
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s "%(a)s"'
# gunicorn's defaults, named: beyond them gunicorn itself answers 414 or 431, in JSON (api/gunicorn_errors.py). No
# route of ours needs a longer URL, and a long header would be a long key or Last-Event-ID, both bounded.
limit_request_line = 4094
limit_request_fields = 100
limit_request_field_size = 8190
install_json_errors()


def on_starting(server: Any) -> None:
    configure_logging(_config)
    check_exposure(_config, [_host_of(address) for address in server.cfg.address])
    clear_multiprocess_dir()  # PROMETHEUS_MULTIPROC_DIR, when set (api/observability/api_metrics.py)


def _host_of(address: Any) -> str:
    """The host of a (host, port) bind; a unix socket is local to this machine; fd:// binds could be anything."""
    if isinstance(address, tuple):
        return str(address[0])
    return "localhost" if isinstance(address, str) else f"fd://{address}"
