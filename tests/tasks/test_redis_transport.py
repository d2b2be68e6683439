"""The Celery broker transport: one Redis client reused for kombu's commands outside its poll, and messages still
published, taken and acknowledged through it."""

from __future__ import annotations

import uuid

from kombu import Connection

from tasks.redis_transport import TRANSPORT


def test_commands_share_one_client_and_messages_still_flow(redis_url: str) -> None:
    queue = f"test-transport-{uuid.uuid4().hex[:8]}"
    with Connection(redis_url, transport=TRANSPORT) as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        with connection.SimpleQueue(queue) as simple:
            simple.put({"n": 1})
            message = simple.get(timeout=5)
            assert message.payload == {"n": 1}
            # the unacked hash is the broker's, shared with every worker on this Redis: look for this message only
            tag = message.delivery_tag
            assert first.hexists(channel.unacked_key, tag), "taken, not yet acknowledged: kept for a restore"
            message.ack()
            assert not first.hexists(channel.unacked_key, tag)
        channel._pool = None  # what kombu does when it drops its connections: the kept client goes with its pool
        with channel.conn_or_acquire() as third:
            assert third is not first and third.ping()
