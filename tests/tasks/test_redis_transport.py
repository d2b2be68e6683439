"""The Celery broker transport: one Redis client reused for kombu's commands outside its poll, messages still
published, taken and acknowledged through it, the messages waiting taken in one read, each recorded before it is
delivered, and the acks of one pass of a worker's event loop written together."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
from kombu import Connection, Queue
from kombu.asynchronous import Hub
from kombu.message import Message

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


@pytest.fixture
def queue(redis_url: str) -> Iterator[str]:
    name = f"test-transport-{uuid.uuid4().hex[:8]}"
    yield name
    cleanup = redis.Redis.from_url(redis_url)
    cleanup.delete(name)
    cleanup.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """The test's own view of Redis; the unacked hash is the broker's, shared with every worker on this Redis, so the
    tests look for their own messages' tags only."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@contextmanager
def consuming(redis_url: str, queue: str, count: int, prefetch: int) -> Iterator[tuple[Connection, list[Message]]]:
    """`count` messages published on `queue`, then one read of a consumer with prefetch limit `prefetch`; the
    messages delivered, in order, not acknowledged."""
    delivered: list[Message] = []
    with Connection(redis_url, transport=TRANSPORT) as connection:
        channel = connection.default_channel
        producer = connection.Producer(channel)
        for number in range(count):
            producer.publish({"n": number}, routing_key=queue, declare=[Queue(queue)])
        callbacks = [lambda body, message: delivered.append(message)]
        with connection.Consumer([Queue(queue)], channel=channel, callbacks=callbacks) as consumer:
            consumer.qos(prefetch_count=prefetch)
            connection.drain_events(timeout=5)
            yield connection, delivered


@contextmanager
def registered_with_a_loop(connection: Connection) -> Iterator[Hub]:
    """The transport registered with an event loop on this thread, as a worker's consumer registers it."""
    loop = Hub()
    try:
        connection.transport.register_with_event_loop(connection.connection, loop)
        yield loop
    finally:
        loop.close()


def test_a_read_takes_what_waits_up_to_the_prefetch_limit_recorded_before_delivery(
    redis_url: str, queue: str, client: redis.Redis
) -> None:
    with consuming(redis_url, queue, count=8, prefetch=5) as (connection, messages):
        unacked_key = connection.default_channel.unacked_key
        # each message's unacked record was written before the message reached its consumer
        assert [(_body_of(m)["n"], bool(client.hexists(unacked_key, m.delivery_tag))) for m in messages] == [
            (number, True) for number in range(5)
        ], "one read: five of eight, in order"
        assert client.llen(queue) == 3
        for message in messages:
            message.ack()
        assert not any(client.hexists(unacked_key, message.delivery_tag) for message in messages)
        connection.drain_events(timeout=5)
        assert [_body_of(message)["n"] for message in messages] == list(range(8))
        for message in messages[5:]:
            message.ack()


def test_messages_taken_together_and_not_acknowledged_go_back_on_their_queue(
    redis_url: str, queue: str, client: redis.Redis
) -> None:
    """What happens to a dead worker's messages: the unacked records written for a read put every one back."""
    with consuming(redis_url, queue, count=4, prefetch=10) as (connection, messages):
        assert len(messages) == 4 and client.llen(queue) == 0
        connection.default_channel.qos.restore_unacked()
    assert sorted(_body(item)["n"] for item in client.lrange(queue, 0, -1)) == [0, 1, 2, 3]


def test_acks_on_the_event_loops_thread_are_written_together_when_its_pass_ends(
    redis_url: str, queue: str, client: redis.Redis
) -> None:
    with consuming(redis_url, queue, count=6, prefetch=6) as (connection, messages):
        channel = connection.default_channel
        tags = [message.delivery_tag for message in messages]
        with registered_with_a_loop(connection) as loop:
            assert connection.transport.write_waiting_acks in loop.on_tick
            for message in messages[:5]:
                message.ack()  # on the loop's thread, as a worker's acks are
            assert channel.qos.can_consume_max_estimate() == 5, "their prefetch slots are free at once"
            assert all(client.hexists(channel.unacked_key, tag) for tag in tags[:5]), "not written yet"
            connection.transport.write_waiting_acks()  # the loop's tick after its pass
            assert not any(client.hexists(channel.unacked_key, tag) for tag in tags[:5])
            assert client.zscore(channel.unacked_index_key, tags[0]) is None
            other_thread = threading.Thread(target=messages[5].ack)
            other_thread.start()
            other_thread.join(5)
            assert not client.hexists(channel.unacked_key, tags[5]), "another thread's ack is written at once"


def test_acks_still_waiting_when_the_channel_closes_are_written_not_restored(
    redis_url: str, queue: str, client: redis.Redis
) -> None:
    with consuming(redis_url, queue, count=1, prefetch=2) as (connection, messages):
        with registered_with_a_loop(connection):
            messages[0].ack()
            connection.default_channel.qos.restore_unacked_once()
        assert not client.hexists(connection.default_channel.unacked_key, messages[0].delivery_tag)
    assert client.llen(queue) == 0, "an acked message is not put back on its queue"


def _body(item: bytes) -> dict:
    """A message as kombu keeps it on a Redis list: its JSON body in base64 inside the envelope."""
    return json.loads(base64.b64decode(json.loads(item)["body"]))


def _body_of(message: Message) -> dict:
    return json.loads(message.body)
