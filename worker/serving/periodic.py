"""A daemon thread that runs one action every `interval_s` until stopped; a failed run is logged and the next one
tries again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class PeriodicThread:
    def __init__(self, name: str, interval_s: float, action: Callable[[], None]) -> None:
        self._interval_s = interval_s
        self._action = action
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run_forever(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._action()
            except Exception:
                logger.exception("%s: a pass failed", self._thread.name)
