"""One thread per worker turns the engine outputs of every chat request in flight into stream events: it detokenizes
them, applies stop strings, and writes every event that arrived since its last pass to Redis in one round trip.

Each request's Celery thread used to wake for every engine output, detokenize it and send its own MULTI/XADD/EXPIRE/
EXEC: as many wake-ups and round trips per engine step as requests in flight, all taking the GIL from the engine
thread. Now a step's outputs cost one wake-up and one round trip, and a request's thread wakes once, when it ends.
A streamed chat or completion's DELTA is written with the SSE payloads its client gets (`encode_chunks`), made here
once rather than in the api for every token.

A pass joins each request's outputs into one DELTA, and passes start at most every `stream_interval_s` (a request's
first token or end starts one at once): what Redis, the api's relay and the client handle per second is bounded by
the number of streams over the interval, not by the engine's step rate, which on a GPU is tens of times this CPU's.
With more streams in flight than `stream_max_frames_per_s` allows at that interval, passes are spaced further apart,
so the frames a second stay within that budget however many streams there are.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import redis
from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.messages.generation import GenerateRequest, StreamEvent
from tasks.messages.stream_chunks import encode_chunks, is_plain_delta
from tasks.streams.events import CHUNKS_FIELD, EVENT_FIELD, append_entries_to_streams
from tasks.streams.redis_keys import RedisKeys
from worker.engine.interface import Engine, EngineOutput
from worker.serving.followed_request import FollowedRequest
from worker.serving.metrics import ServingMetrics

logger = logging.getLogger(__name__)


def _entry_fields(request: GenerateRequest, event: StreamEvent) -> dict[str, str]:
    fields = {EVENT_FIELD: event_json(event)}
    if request.stream_meta is not None:
        fields[CHUNKS_FIELD] = encode_chunks(request.stream_meta, event)
    return fields


def event_json(event: StreamEvent) -> str:
    """`json.dumps(event.to_dict())`, character for character; a token's DELTA (text, ids, its choice) without the
    13-field dict `to_dict` builds and filters, which cost as much as the rest of the entry's encoding."""
    if not is_plain_delta(event) or event.usage or event.steering or event.monitor:
        return json.dumps(event.to_dict())
    parts = ['{"type": "delta"']
    if event.text:
        parts.append(f', "text": {json.dumps(event.text)}')
    if event.token_ids:
        parts.append(f', "token_ids": {json.dumps(list(event.token_ids))}')
    if event.index:
        parts.append(f', "index": {event.index}')
    if event.text_offset:
        parts.append(f', "text_offset": {event.text_offset}')
    parts.append("}")
    return "".join(parts)


class OutputProcessor:
    """`put` is the engine's output callback (any thread); `follow` starts applying a request's outputs, `forget`
    stops it and returns once no event of the request is being written."""

    def __init__(
        self,
        client: redis.Redis,
        config: Config,
        tokenizer: PreTrainedTokenizerFast,
        engine: Engine,
        metrics: ServingMetrics,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._config = config
        self._keys = RedisKeys(config.redis_prefix)
        self._tokenizer = tokenizer
        self._engine = engine
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._pass_ended = threading.Condition(self._lock)
        self._ready: dict[FollowedRequest, None] = {}  # followed requests with pending outputs, in arrival order
        self._is_stopping = False
        # A pass starts `pass_interval_s()` after the one before, unless an output waiting is a request's first
        # token or its end (`_is_urgent`): the steps between join each request's tokens into one entry.
        self._interval_s = config.stream_interval_s
        self._max_frames_per_s = config.stream_max_frames_per_s
        self._num_followed = 0  # requests followed and not yet forgotten: the streams a pass may write a frame each
        self._is_urgent = False
        self._last_pass_at = 0.0  # monotonic seconds
        self._thread = threading.Thread(target=self._run, name="output-processor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread once every output that has arrived is applied and written (a stopping engine's aborts)."""
        with self._lock:
            self._is_stopping = True
            self._has_work.notify_all()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def put(self, followed: FollowedRequest, output: EngineOutput) -> None:
        with self._lock:
            if followed.is_forgotten:
                return
            followed.pending.append(output)
            if not followed.is_followed:
                return
            is_urgent = output.is_finished or not followed.has_outputs_taken
            if followed not in self._ready or (is_urgent and not self._is_urgent):
                self._ready[followed] = None
                self._is_urgent = self._is_urgent or is_urgent
                self._has_work.notify()

    def follow(self, followed: FollowedRequest, opening: StreamEvent | None = None) -> None:
        """Outputs that arrived before this (the request's choices were still being submitted) are applied now.
        `opening` (the START event its claim allows) goes out first, in the same Redis call as the events of the
        outputs waiting, rather than in a round trip of its own before them."""
        with self._lock:
            if not followed.is_followed and not followed.is_forgotten:
                self._num_followed += 1
            followed.is_followed = True
            followed.opening = opening
            if followed.pending or opening is not None:
                self._ready[followed] = None
                self._is_urgent = True  # its START event or first token
                self._has_work.notify()

    def forget(self, followed: FollowedRequest) -> None:
        with self._lock:
            if followed.is_forgotten:
                return
            self._stop_following(followed)
            self._ready.pop(followed, None)
            self._pass_ended.wait_for(lambda: not followed.is_in_pass)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._has_work.wait_for(lambda: self._ready or self._is_stopping)
                self._wait_for_interval()
                if not self._ready:
                    if self._is_stopping:
                        return
                    continue  # forgotten while the pass waited
                taken = [(followed, followed.pending) for followed in self._ready]
                for followed, outputs in taken:
                    followed.pending = []
                    followed.is_in_pass = True
                    followed.has_outputs_taken = followed.has_outputs_taken or bool(outputs)
                self._ready = {}
                self._is_urgent = False
                self._last_pass_at = time.monotonic()
            try:
                self._process(taken)
            except Exception as exc:  # a failure past one request's outputs fails the pass's requests, not the thread
                logger.exception("a pass over %d requests' outputs failed", len(taken))
                for followed, _ in taken:
                    followed.failure = exc
                    self._end(followed)
            finally:
                with self._lock:
                    for followed, _ in taken:
                        followed.is_in_pass = False
                    self._pass_ended.notify_all()

    def _stop_following(self, followed: FollowedRequest) -> None:
        """Under the lock: its outputs are dropped from now on."""
        if not followed.is_forgotten and followed.is_followed:
            self._num_followed -= 1
        followed.is_forgotten = True

    def pass_interval_s(self) -> float:
        """How long after a pass the next one starts, unless an output is urgent: `stream_interval_s`, or the
        interval at which the streams followed get `stream_max_frames_per_s` frames a second together if longer."""
        if self._max_frames_per_s <= 0:
            return self._interval_s
        return max(self._interval_s, self._num_followed / self._max_frames_per_s)

    def _wait_for_interval(self) -> None:
        """Holds the lock's caller until the pass interval has passed since the last pass started, an urgent output
        arrives, or the processor stops."""
        remaining_s = self._last_pass_at + self.pass_interval_s() - time.monotonic()
        if remaining_s > 0:
            self._has_work.wait_for(lambda: self._is_urgent or self._is_stopping, timeout=remaining_s)

    def _process(self, taken: list[tuple[FollowedRequest, list[EngineOutput]]]) -> None:
        """One transaction writes the pass's events, so a failed write fails every request that had events in it."""
        entries: list[tuple[str, dict[str, str]]] = []
        written = []
        with_tokens = []
        expire_keys = []
        for followed, outputs in taken:
            try:
                events = followed.apply(outputs, self._tokenizer, self._engine)
            except Exception as exc:  # one request's bad output must not end the others'
                logger.exception("request %s: applying its engine outputs failed", followed.request.request_id)
                followed.failure = exc
                self._end(followed)
                continue
            key = self._keys.request_stream(followed.request.request_id)
            opening, followed.opening = followed.opening, None
            if opening is not None:  # written as the worker's other events are, without chunks: the relay makes them
                entries.append((key, {EVENT_FIELD: json.dumps(opening.to_dict())}))
            entries.extend((key, _entry_fields(followed.request, event)) for event in events)
            written.append(followed)
            if (events and self._is_expiry_due(followed)) or opening is not None:  # the first entry sets the expiry
                expire_keys.append(key)
            if any(event.token_ids for event in events):
                with_tokens.append(followed)
        try:
            if entries:
                append_entries_to_streams(self._client, self._config, entries, expire_keys)
        except redis.RedisError as exc:
            logger.warning("writing %d stream events of %d requests failed: %s", len(entries), len(written), exc)
            self._metrics.count_error(exc)
            for followed in written:
                followed.failure = exc
        self._time_tokens(with_tokens)
        for followed in written:
            if followed.failure is not None or followed.has_ended:
                self._end(followed)

    def _is_expiry_due(self, followed: FollowedRequest) -> bool:
        """Whether to renew the stream's expiry with this pass: once half of it has run, so that a stream lives at
        least half of `stream_ttl_s` past its last entry while it runs (its FINAL event sets the whole of it again),
        for one EXPIRE per request in a long while rather than one per pass."""
        now = time.monotonic()
        if now - followed.expiry_set_at < self._config.stream_ttl_s / 2:
            return False
        followed.expiry_set_at = now
        return True

    def _time_tokens(self, with_tokens: list[FollowedRequest]) -> None:
        """First-token and inter-token latencies of the requests whose tokens this pass wrote, as clients see them."""
        now = time.time()
        for followed in with_tokens:
            if followed.failure is None:
                self._metrics.observe_tokens(followed.request, followed.last_token_at, now)
                followed.last_token_at = now

    def _end(self, followed: FollowedRequest) -> None:
        with self._lock:
            self._stop_following(followed)
            self._ready.pop(followed, None)  # outputs that arrived during this pass: nothing of it is written now
            followed.pending.clear()
        followed.done.set()
