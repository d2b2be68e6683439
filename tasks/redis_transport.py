"""kombu's Redis transport with four changes: a Redis restart never ends a Celery worker, one Redis client serves
every command kombu sends outside its poll, a worker takes the messages waiting on a queue in one read, and the acks
of one pass of a worker's event loop are written together.

When the broker connection drops, Celery's consumer first `collect()`s the connection, which detaches the transport
from it (`transport.client = None`) but keeps the default channel, then `close()`s it. Closing that channel tries to
put the worker's unacknowledged messages back on their queues, which builds a Redis client from
`transport.client.hostname`: an AttributeError that kombu does not expect, so the worker logs "Unrecoverable error"
and exits. Each channel here remembers its connection's settings, so the restore tries Redis instead: when Redis is
still down that is a connection error, which kombu ignores; when it is back, the messages are restored as intended.

kombu builds a new `redis.Redis` for each command it sends outside its poll (`Channel.conn_or_acquire`): each publish
in the api, each message a worker takes (its unacked record) and each ack. redis-py 8 fills a table of some 170 reply
callbacks in every client's constructor: 0.4 ms of the api's 4.5 ms of CPU per streamed completion (cProfile, Flask's
test client), and as much on each of a worker's two per task. A client holds no connection of its own (it takes one
from the pool per command, as each new one did), so the channel keeps one per pool and hands it out again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps, loads

TRANSPORT = "tasks.redis_transport:Transport"  # Celery's `broker_transport` setting


class QoS(kombu_redis.QoS):
    """kombu's unacked records (what puts a message back on its queue when its worker dies before the ack), written
    for a read's messages together before any is delivered; `append` then only keeps the delivery in memory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recorded: set[str] = set()
        self._acks_waiting: list[str] = []  # acked on the event loop's thread, written at the end of its pass

    def record_unacked(self, pipe: redis.client.Pipeline, payloads: list[dict[str, Any]]) -> None:
        now = time.time()
        records = {}
        for payload in payloads:
            properties = payload["properties"]
            delivery = properties["delivery_info"]
            records[properties["delivery_tag"]] = dumps([payload, delivery["exchange"], delivery["routing_key"]])
        pipe.zadd(self.unacked_index_key, dict.fromkeys(records, now))
        pipe.hset(self.unacked_key, mapping=records)
        self._recorded.update(records)

    def forget_recorded(self, payloads: list[dict[str, Any]]) -> None:
        """After a read's deliveries, or its failure: what was not appended must not skip a later record."""
        self._recorded.difference_update(payload["properties"]["delivery_tag"] for payload in payloads)

    def ack(self, delivery_tag: str) -> None:
        """A Celery worker acks on its event loop's thread: each task's ack is a callback the loop runs at the top of
        its next pass, one round trip each. Those acks free their prefetch slots at once and are written together
        when the loop's pass ends (`Transport.write_waiting_acks`, before it polls again). An ack from any other
        thread, or with no event loop, is written at once, as kombu does."""
        if getattr(self.channel.connection, "loop_thread", None) != threading.get_ident():
            super().ack(delivery_tag)
            return
        virtual.QoS.ack(self, delivery_tag)
        self._acks_waiting.append(delivery_tag)

    def write_waiting_acks(self) -> None:
        tags, self._acks_waiting = self._acks_waiting, []
        if not tags:
            return
        try:
            with self.pipe_or_acquire() as pipe:
                pipe.zrem(self.unacked_index_key, *tags).hdel(self.unacked_key, *tags).execute()
        except BaseException:
            self._acks_waiting[:0] = tags  # tried again with the next pass's, or at the channel's close
            raise

    def restore_unacked_once(self, stderr: Any = None) -> Any:
        """At the channel's close: the acks still waiting are written first, so that their messages are not put back
        (when Redis refuses, they are, and the claim of a request that already ended turns its rerun away)."""
        with contextlib.suppress(redis.RedisError):
            self.write_waiting_acks()
        return super().restore_unacked_once(stderr)

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag in self._recorded:
            self._recorded.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)


class Channel(kombu_redis.Channel):
    QoS = QoS

    def __init__(self, connection: Any, *args: Any, **kwargs: Any) -> None:
        self._conninfo = connection.client  # the kombu Connection, before anything detaches it
        super().__init__(connection, *args, **kwargs)

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            self.connection.client = self._conninfo
        return super()._connparams(asynchronous=asynchronous)

    def _create_client(self, asynchronous: bool = False) -> redis.Redis:
        if asynchronous:  # the poll's own client, made once per poll connection
            return super()._create_client(asynchronous=True)
        kept = getattr(self, "_kept_client", None)
        if kept is None or kept.connection_pool is not self.pool:  # a new pool after a reconnect: a new client
            kept = self._kept_client = super()._create_client()
        return kept

    def _brpop_read(self, **options: Any) -> bool:
        """BRPOP's message and up to as many more as the prefetch limit leaves room for, from the same queue.

        kombu delivers one message per BRPOP: for a burst of 32 requests a worker read, recorded and handed over each
        alone, 32 round trips for the reads and 32 more for their unacked records. Here the first message's record
        and an RPOP of what waits behind it go in one round trip, the others' records in one more, and only then are
        they delivered, in queue order: a message is recorded before its task can run, as in kombu. A lone message
        costs one round trip, as before. Between the RPOP's reply and its records being written, a worker that dies
        loses those messages, as kombu's worker loses the one between BRPOP's reply and its record."""
        if self.global_keyprefix:  # the reply's key carries the prefix, which the kept client would add again
            return super()._brpop_read(**options)
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next poll reconnects
                raise
            if not reply:
                raise Empty()
            key = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
            queue = key.rsplit(self.sep, 1)[0]  # a priority level's list is the queue's name and a suffix
            self._queue_cycle.rotate(queue)
            payloads = [loads(reply[1])]
            room = (self.qos.can_consume_max_estimate() or 1) - 1  # 0: no prefetch limit, take one as kombu does
            try:
                with self.conn_or_acquire() as client:
                    pipe = client.pipeline(transaction=False)
                    self.qos.record_unacked(pipe, payloads)
                    if room > 0:
                        pipe.rpop(key, room)
                    replies = pipe.execute()
                    more = replies[-1] if room > 0 else None
                    if more:
                        taken = [loads(item) for item in more]
                        payloads.extend(taken)
                        pipe = client.pipeline(transaction=False)
                        self.qos.record_unacked(pipe, taken)
                        pipe.execute()
                for payload in payloads:
                    self.connection._deliver(payload, queue)
            finally:  # whatever failed: a tag recorded here and never appended must not skip a later record
                self.qos.forget_recorded(payloads)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()


class Transport(kombu_redis.Transport):
    Channel = Channel
    loop_thread: int | None = None  # the thread of the event loop this transport is registered with

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        super().register_with_event_loop(connection, loop)
        self.loop_thread = threading.get_ident()
        loop.on_tick.add(self.write_waiting_acks)  # the loop runs its tick callbacks after its pass, before its poll

    def write_waiting_acks(self) -> None:
        for channel in self.channels:
            if channel._qos is not None:
                channel._qos.write_waiting_acks()
