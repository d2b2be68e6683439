"""One thread per api process reads every request stream its responses relay, in one blocking XREAD, and hands each
response the entries after its own position.

Each response's thread used to block in an XREAD of its own: per token of every stream, one round trip, one Redis
client woken and one thread's GIL hand-off. Now a worker's pass over N streams costs the api one XREAD reply. The hub
hands each reader the entries of one reply together and undecoded: a chat relay forwards the payloads the worker
encoded (`read_entries`), and only readers that want the events decode them (`read_json`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import redis

from tasks.streams.events import ENTRIES_PER_READ, STREAM_START, Entry, entry_json, entry_order

logger = logging.getLogger(__name__)
BLOCK_MS = 1000  # how long one XREAD waits for any of the streams; a new reader cuts it short
WAKE_STREAM_TTL_S = 3600


@dataclass(eq=False)
class _Reader:
    key: str
    after_id: str  # the last entry handed over; the hub's thread alone moves it
    # lists of (entry id, fields), one per XREAD reply with entries for it, or a RedisError
    batches: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)


class StreamHub:
    """`read_json` has `tasks.streams.events.read_json`'s contract, the client bound: a `JsonReader`."""

    def __init__(self, client: redis.Redis, wake_key: str) -> None:
        self._client = client
        self._wake_key = wake_key  # a stream of this hub's own: an entry ends its XREAD so that it adds a new reader
        self._wake_after = STREAM_START
        self._lock = threading.Lock()
        self._readers: dict[_Reader, None] = {}
        # a wake entry is written that no read of the hub has started after: a reader added meanwhile is in that
        # read's positions, so a burst of new readers wakes the hub once, not once each (and re-reads all its streams)
        self._is_wake_written = False
        self._thread: threading.Thread | None = None  # started with the first reader, ended after the last

    def read_json(self, key: str, after_id: str, block_ms: int) -> Iterator[tuple[str, dict] | None]:
        """The JSON events of `key` after `after_id`, for ever; None each time `block_ms` passes with none (0: wait
        for ever, as XREAD's BLOCK 0). ValueError for an id Redis would refuse: it would fail every reader's XREAD."""
        for batch in self.read_entries(key, after_id, block_ms):
            if batch is None:
                yield None
                continue
            for entry_id, fields in batch:
                yield entry_id, entry_json(fields)

    def read_entries(self, key: str, after_id: str, block_ms: int) -> Iterator[list[Entry] | None]:
        """`read_json`'s entries undecoded, those that one reply brought as one batch: an `EntryReader`."""
        entry_order(after_id)
        reader = _Reader(key, after_id)
        timeout_s = block_ms / 1000 if block_ms > 0 else None
        try:
            self._add(reader)
            while True:
                try:
                    item = reader.batches.get(timeout=timeout_s)
                except queue.Empty:
                    yield None
                    continue
                if isinstance(item, redis.RedisError):
                    raise item
                yield item
        finally:
            with self._lock:
                self._readers.pop(reader, None)

    def _add(self, reader: _Reader) -> None:
        with self._lock:
            self._readers[reader] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stream-hub", daemon=True)
                self._thread.start()
            if self._is_wake_written:
                return
            self._is_wake_written = True
        pipe = self._client.pipeline(transaction=False)
        pipe.xadd(self._wake_key, {"reader": reader.key}, maxlen=16, approximate=True)
        pipe.expire(self._wake_key, WAKE_STREAM_TTL_S)
        try:
            pipe.execute()
        except redis.RedisError:
            with self._lock:
                self._is_wake_written = False  # the next reader tries again
            raise

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._readers:
                    self._thread = None
                    return
                readers = list(self._readers)
                self._is_wake_written = False  # a reader added from now on is not in this read: it wakes the hub
            try:
                reply = self._client.xread(self._positions(readers), count=ENTRIES_PER_READ, block=BLOCK_MS)
                self._deliver(reply or [], readers)
            except redis.RedisError as exc:
                self._fail(readers, exc)
            except Exception as exc:  # the readers must hear of it, or they would wait for ever
                logger.exception("the stream hub's pass failed")
                self._fail(readers, redis.RedisError(f"the stream hub failed: {exc}"))

    def _positions(self, readers: list[_Reader]) -> dict[str, str]:
        """Each stream from the earliest position any of its readers is at."""
        positions = {self._wake_key: self._wake_after}
        for reader in readers:
            current = positions.get(reader.key)
            if current is None or entry_order(reader.after_id) < entry_order(current):
                positions[reader.key] = reader.after_id
        return positions

    def _deliver(self, reply: list, readers: list[_Reader]) -> None:
        by_key: dict[str, list[_Reader]] = {}
        for reader in readers:
            by_key.setdefault(reader.key, []).append(reader)
        for key, entries in reply:
            if key == self._wake_key:
                self._wake_after = entries[-1][0]
                continue
            stream_readers = by_key.get(key, [])
            if len(stream_readers) == 1 and reader_is_behind(stream_readers[0], entries):
                stream_readers[0].batches.put(entries)  # the usual case: one relay, which has none of these yet
                stream_readers[0].after_id = entries[-1][0]
                continue
            for reader in stream_readers:
                after = entry_order(reader.after_id)
                batch = [entry for entry in entries if entry_order(entry[0]) > after]
                if batch:
                    reader.batches.put(batch)
                    reader.after_id = batch[-1][0]

    def _fail(self, readers: list[_Reader], exc: redis.RedisError) -> None:
        """Each reader raises it; new readers start over."""
        with self._lock:
            for reader in readers:
                self._readers.pop(reader, None)
        for reader in readers:
            reader.batches.put(exc)


def reader_is_behind(reader: _Reader, entries: list[Entry]) -> bool:
    """Whether the reader lacks every entry of the reply (it was read from the reader's own position)."""
    return entry_order(entries[0][0]) > entry_order(reader.after_id)
