"""kombu's Redis transport with one fix, so that a Redis restart never ends a Celery worker.

When the broker connection drops, Celery's consumer first `collect()`s the connection, which detaches the transport
from it (`transport.client = None`) but keeps the default channel, then `close()`s it. Closing that channel tries to
put the worker's unacknowledged messages back on their queues, which builds a Redis client from
`transport.client.hostname`: an AttributeError that kombu does not expect, so the worker logs "Unrecoverable error"
and exits. Each channel here remembers its connection's settings, so the restore tries Redis instead: when Redis is
still down that is a connection error, which kombu ignores; when it is back, the messages are restored as intended.
"""

from __future__ import annotations

from typing import Any

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


class Transport(kombu_redis.Transport):
    Channel = Channel
