"""The Celery broker transport: one Redis client reused for kombu's commands outside its poll, messages still
published, taken and acknowledged through it, and the messages waiting taken in one read, each recorded before it is
delivered."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Callable

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


def test_a_read_takes_what_waits_up_to_the_prefetch_limit_recorded_before_delivery(redis_url: str) -> None:
    queue = f"test-transport-{uuid.uuid4().hex[:8]}"
    delivered: list[tuple[int, bool]] = []
    with Connection(redis_url, transport=TRANSPORT) as connection:
        channel = connection.default_channel
        client = redis.Redis.from_url(redis_url)
        try:
            producer = connection.Producer(channel)
            for number in range(8):
                producer.publish({"n": number}, routing_key=queue, declare=[Queue(queue)])

            def on_message(body: dict, message: Message) -> None:
                # its unacked record is written before the message reaches its consumer
                delivered.append((body["n"], bool(client.hexists(channel.unacked_key, message.delivery_tag))))
                messages.append(message)

            messages: list[Message] = []
            with connection.Consumer([Queue(queue)], channel=channel, callbacks=[on_message]) as consumer:
                consumer.qos(prefetch_count=5)
                connection.drain_events(timeout=5)
                assert delivered == [(number, True) for number in range(5)], "one read: five of eight, in order"
                assert client.llen(queue) == 3
                for message in messages:
                    message.ack()
                assert not any(client.hexists(channel.unacked_key, message.delivery_tag) for message in messages)
                connection.drain_events(timeout=5)
                assert [number for number, _ in delivered] == list(range(8))
                for message in messages[5:]:
                    message.ack()
        finally:
            client.delete(queue)
            client.close()


def test_messages_taken_together_and_not_acknowledged_go_back_on_their_queue(redis_url: str) -> None:
    """What happens to a dead worker's messages: the unacked records written for a read put every one back."""
    queue = f"test-transport-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    try:
        with Connection(redis_url, transport=TRANSPORT) as connection:
            channel = connection.default_channel
            producer = connection.Producer(channel)
            for number in range(4):
                producer.publish({"n": number}, routing_key=queue, declare=[Queue(queue)])
            with connection.Consumer(
                [Queue(queue)], channel=channel, callbacks=[lambda body, message: None]
            ) as consumer:
                consumer.qos(prefetch_count=10)
                connection.drain_events(timeout=5)
                assert client.llen(queue) == 0
            channel.qos.restore_unacked()
        assert sorted(_body(item)["n"] for item in client.lrange(queue, 0, -1)) == [0, 1, 2, 3]
    finally:
        client.delete(queue)
        client.close()


def test_acks_on_the_event_loops_thread_are_written_together_when_its_pass_ends(redis_url: str) -> None:
    queue = f"test-transport-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    messages: list[Message] = []
    try:
        with Connection(redis_url, transport=TRANSPORT) as connection:
            channel = connection.default_channel
            producer = connection.Producer(channel)
            for number in range(6):
                producer.publish({"n": number}, routing_key=queue, declare=[Queue(queue)])
            with connection.Consumer([Queue(queue)], channel=channel, callbacks=[_keep(messages)]) as consumer:
                consumer.qos(prefetch_count=6)
                connection.drain_events(timeout=5)
                assert len(messages) == 6
                tags = [message.delivery_tag for message in messages]
                loop = Hub()
                try:
                    connection.transport.register_with_event_loop(connection.connection, loop)
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
                finally:
                    loop.close()
    finally:
        client.delete(queue)
        client.close()


def test_acks_still_waiting_when_the_channel_closes_are_written_not_restored(redis_url: str) -> None:
    queue = f"test-transport-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    messages: list[Message] = []
    try:
        with Connection(redis_url, transport=TRANSPORT) as connection:
            channel = connection.default_channel
            connection.Producer(channel).publish({"n": 0}, routing_key=queue, declare=[Queue(queue)])
            with connection.Consumer([Queue(queue)], channel=channel, callbacks=[_keep(messages)]) as consumer:
                consumer.qos(prefetch_count=2)
                connection.drain_events(timeout=5)
                loop = Hub()
                try:
                    connection.transport.register_with_event_loop(connection.connection, loop)
                    messages[0].ack()
                    channel.qos.restore_unacked_once()
                finally:
                    loop.close()
            assert not client.hexists(channel.unacked_key, messages[0].delivery_tag)
        assert client.llen(queue) == 0, "an acked message is not put back on its queue"
    finally:
        client.delete(queue)
        client.close()


def _keep(messages: list[Message]) -> Callable[[dict, Message], None]:
    return lambda body, message: messages.append(message)


def _body(item: bytes) -> dict:
    """A message as kombu keeps it on a Redis list: its JSON body in base64 inside the envelope."""
    return json.loads(base64.b64decode(json.loads(item)["body"]))


def _ignore(body: dict, message: Message) -> None:
    """A consumer that dies before its acks: it takes the messages and never acknowledges them."""
