"""Flower as the launcher and compose run it: `celery flower` with its /metrics and /healthcheck behind the same
basic auth as its other pages (Flower serves those two to anyone). Arguments are celery's, e.g.
`python -m scripts.flower --broker redis://... flower --port=5555`; the password comes from FLOWER_BASIC_AUTH."""

from __future__ import annotations

import sys

import tornado.web
from celery.__main__ import main
from flower.views import monitor


def require_auth_everywhere() -> None:
    for handler in (monitor.Metrics, monitor.Healthcheck):
        handler.get = tornado.web.authenticated(handler.get)  # type: ignore[method-assign]


if __name__ == "__main__":
    require_auth_everywhere()
    sys.exit(main())
