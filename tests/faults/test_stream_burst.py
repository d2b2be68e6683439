"""A burst of 500 streamed chats sent at once through the whole stack (gunicorn api, one Celery worker with the tiny
model, PostgreSQL), each by the real `openai` client with its default retries (max_retries=2): every stream succeeds.
The part of the burst the api cannot admit at once waits for its turn at the admission gate, or, when the gate's queue
could not drain in time, is refused with a retry hint long enough that the client's own retries are admitted."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from scripts.stack import Stack, launcher_key
from tests.conftest import make_test_config
from tests.postgres import own_database

logger = logging.getLogger(__name__)
NUM_STREAMS = 500
MESSAGES = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def burst_stack(
    tiny_model_dir: Path, redis_url: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # A database of its own: the session's running stack shares `postgres_url`, and its reaper, which cannot see this
    # stack's worker leases under its own key prefix, would fail this stack's running requests as worker_lost.
    with own_database(postgres_url) as database_url:
        config = make_test_config(tiny_model_dir, redis_url, database_url, api_connections=2048)
        log_dir = tmp_path_factory.mktemp("burst-logs")
        stack = Stack(config, log_dir=log_dir, api_key=launcher_key(config, "test-burst"))
        stack.start()
        yield stack
        stack.stop()


async def stream_chat(client: openai.AsyncOpenAI, model: str) -> str:
    """One streamed chat read to its end (keep-alives included, on a machine this busy): its finish reason."""
    stream = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, stream=True)
    finish_reason = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason is not None:
            finish_reason = chunk.choices[0].finish_reason
    return str(finish_reason)


async def burst(stack: Stack, statuses: list[int]) -> list[str | BaseException]:
    """NUM_STREAMS streamed chats at once from one `openai` client with its default retries; `statuses` gets the
    status of every HTTP response, retries included."""

    async def note(response: httpx.Response) -> None:
        statuses.append(response.status_code)

    limits = httpx.Limits(max_connections=NUM_STREAMS + 8, max_keepalive_connections=NUM_STREAMS)
    http_client = openai.DefaultAsyncHttpxClient(limits=limits, event_hooks={"response": [note]})
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, http_client=http_client)
    assert client.max_retries == openai.DEFAULT_MAX_RETRIES == 2
    async with client:
        chats = (stream_chat(client, stack.config.model_name) for _ in range(NUM_STREAMS))
        return await asyncio.gather(*chats, return_exceptions=True)


@pytest.mark.timeout(600)  # 138 s (stack start included) on the 2-core machine at a load average of 16
def test_a_burst_of_streams_all_succeed_with_the_openai_clients_default_retries(burst_stack: Stack) -> None:
    statuses: list[int] = []
    started = time.monotonic()
    outcomes = asyncio.run(burst(burst_stack, statuses))
    took_s = time.monotonic() - started
    failures = collections.Counter(
        f"{type(outcome).__name__}: {getattr(outcome, 'code', '') or outcome}"
        for outcome in outcomes
        if isinstance(outcome, BaseException)
    )
    logger.info(
        "%d streams in %.1f s; HTTP statuses %s; failures %s",
        NUM_STREAMS,
        took_s,
        dict(collections.Counter(statuses)),
        dict(failures),
    )
    assert not failures, f"{sum(failures.values())} of {NUM_STREAMS} streams failed: {dict(failures)}"
    assert set(outcomes) <= {"length", "stop"}, collections.Counter(outcomes)  # each stream read to its end
