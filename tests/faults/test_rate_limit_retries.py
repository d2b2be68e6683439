"""The official `openai` client honours our 429 end to end: on a key allowed one request a minute, a client with
retries waits the advertised `Retry-After` and then succeeds; one without retries raises `RateLimitError` carrying
our OpenAI-shaped error."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from scripts.stack import Stack, launcher_key
from tasks.rate_limits import WINDOW_S
from tests.conftest import make_test_config

logger = logging.getLogger(__name__)
# The first (admitted) and the refused requests must share a one-minute window, and the retry's wait, what is left
# of it, should be short: so the test starts with this much of a window left.
WINDOW_LEFT_S = (8.0, 15.0)


@pytest.fixture(scope="module")
def limited_stack(tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('rate-limit') / 'db.sqlite'}"
    config = make_test_config(tiny_model_dir, redis_url, database_url, rate_limit_rpm=1)
    log_dir = tmp_path_factory.mktemp("rate-limit-logs")
    stack = Stack(config, log_dir=log_dir, api_key=launcher_key(config, "test-limited"))
    stack.start()
    yield stack
    stack.stop()


def client_for(stack: Stack, max_retries: int, responses: list[tuple[float, int, str | None]]) -> openai.OpenAI:
    """A client that notes (time, status, Retry-After) of every HTTP response it gets, retries included."""

    def note(response) -> None:  # type: ignore[no-untyped-def]
        responses.append((time.monotonic(), response.status_code, response.headers.get("retry-after")))

    http_client = openai.DefaultHttpxClient(event_hooks={"response": [note]})
    base_url = f"{stack.base_url}/v1"
    return openai.OpenAI(base_url=base_url, api_key=stack.api_key, max_retries=max_retries, http_client=http_client)


def wait_for_window_left(low_s: float, high_s: float) -> None:
    while not low_s <= WINDOW_S - time.time() % WINDOW_S <= high_s:
        time.sleep(0.2)


def complete(client: openai.OpenAI, stack: Stack) -> openai.types.Completion:
    return client.completions.create(model=stack.config.model_name, prompt="the cat", max_tokens=2)


def test_the_openai_client_retries_after_our_retry_after(limited_stack: Stack) -> None:
    stack = limited_stack
    responses: list[tuple[float, int, str | None]] = []
    wait_for_window_left(*WINDOW_LEFT_S)
    complete(client_for(stack, 0, responses), stack)

    with pytest.raises(openai.RateLimitError) as refused:
        complete(client_for(stack, 0, responses), stack)
    assert refused.value.status_code == 429
    assert refused.value.body == {
        "message": refused.value.body["message"],  # type: ignore[index]
        "type": "rate_limit_exceeded",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert "per minute" in refused.value.message and int(refused.value.response.headers["Retry-After"]) >= 1

    reply = complete(client_for(stack, 2, responses), stack)
    assert reply.choices[0].text is not None
    (_, first, _), (_, second, _), (refused_at, third, retry_after), (served_at, fourth, _) = responses
    assert [first, second, third, fourth] == [200, 429, 429, 200], responses
    waited_s = served_at - refused_at
    assert retry_after is not None and int(retry_after) <= waited_s < int(retry_after) + 5, (retry_after, waited_s)
    logger.info("429 with Retry-After %s s; the openai client's retry succeeded %.1f s later", retry_after, waited_s)
