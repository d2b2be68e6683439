"""One thread per worker reads the Redis flags its task threads wait on, all in one round trip every `interval_s`,
and tells each waiting thread once when its flag is set. Task threads polling Redis themselves, 20 times a second
each, took the GIL from the engine thread often enough to slow every decode step by about 5 % (batch chunks), and
woke as many threads as requests in flight (chat)."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Generic, TypeVar

import redis

from worker.serving.periodic import PeriodicThread

logger = logging.getLogger(__name__)
POLL_S = 0.05  # how soon a task thread hears of its flag

Value = TypeVar("Value")
FlagReader = Callable[[list[str]], dict[str, Value]]  # the keys whose flag is set, with its value, in one round trip


class FlagWatcher(Generic[Value]):
    def __init__(self, name: str, read_flags: FlagReader[Value], interval_s: float = POLL_S) -> None:
        self._name = name
        self._read_flags = read_flags
        self._lock = threading.Lock()
        self._callbacks: defaultdict[str, list[Callable[[Value], None]]] = defaultdict(list)  # by key
        self._is_failing = False  # Redis failed the last pass: warned once, not 20 times a second
        self._thread = PeriodicThread(name, interval_s, self._watch_once)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def watch(self, key: str, callback: Callable[[Value], None]) -> None:
        """Calls `callback` with the flag's value once, from the watcher's thread, when `key`'s flag is set."""
        with self._lock:
            self._callbacks[key].append(callback)

    def forget(self, key: str, callback: Callable[[Value], None]) -> None:
        with self._lock:
            callbacks = self._callbacks.get(key, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._callbacks.pop(key, None)

    def _watch_once(self) -> None:
        with self._lock:
            watched = list(self._callbacks)
        if not watched:
            return
        try:
            flags = self._read_flags(watched)
        except redis.RedisError as exc:  # the next pass tries again
            if not self._is_failing:
                logger.warning("%s could not read %d flags (retrying): %s", self._name, len(watched), exc)
            self._is_failing = True
            return
        if self._is_failing:
            logger.info("%s reads its flags again", self._name)
            self._is_failing = False
        for key, value in flags.items():
            with self._lock:
                callbacks = self._callbacks.pop(key, [])
            for callback in callbacks:
                callback(value)
