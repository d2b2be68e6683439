"""kombu's Redis transport with two changes: a Redis restart never ends a Celery worker, and one Redis client serves
every command kombu sends outside its poll.

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

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

TRANSPORT = "tasks.redis_transport:Transport"  # Celery's `broker_transport` setting


class Channel(kombu_redis.Channel):
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


class Transport(kombu_redis.Transport):
    Channel = Channel
