"""`make demo`: start the stack on the embedded defaults, stream one chat reply, send a few concurrent
requests with the official `openai` client, print them, have the model call a tool, and stop everything. The demo
makes its own admin key (`demo`) in the stack's database for its client, and revokes it at the end."""

from __future__ import annotations

import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

from scripts.stack import Stack, launcher_key
from tasks.config import REPO_ROOT, Config
from tasks.logs import configure_logging
from tasks.store.api_keys import revoke_key
from tasks.store.db import make_db_engine, make_session_factory

logger = logging.getLogger("demo")
QUESTIONS = ["what is 3 plus 4?", "name a color", "tell me about cats", "what is 2 plus 2?"]
KEY_NAME = "demo"
CITY_MAX_CHARS = 24
# The whole call, at most: its fixed text (75 bytes, 79 with the one space the grammar allows in each of the four
# gaps of the arguments object), the city's characters as JSON escapes (6 bytes each at most), a token being at
# least one byte, and the end-of-turn token.
TOOL_CALL_MAX_TOKENS = 79 + 6 * CITY_MAX_CHARS + 1

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        # maxLength bounds the call, so it always fits in TOOL_CALL_MAX_TOKENS
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": CITY_MAX_CHARS}},
            "required": ["city"],
        },
    },
}


def stream_one(client: OpenAI, model: str) -> None:
    logger.info("streamed chat: %r", QUESTIONS[0])
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTIONS[0]}],
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            sys.stdout.write(chunk.choices[0].delta.content)
            sys.stdout.flush()
        if chunk.usage is not None:
            sys.stdout.write(f"\n  [{chunk.usage.completion_tokens} tokens in {time.perf_counter() - started:.2f} s]\n")
    if not pieces:
        raise RuntimeError("the streamed reply was empty")


def ask(client: OpenAI, model: str, question: str) -> tuple[str, str, str | None, float]:
    started = time.perf_counter()
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=48, temperature=0.7, seed=7
    )
    return (
        question,
        reply.choices[0].message.content or "",
        reply.choices[0].finish_reason,
        time.perf_counter() - started,
    )


def call_a_tool(client: OpenAI, model: str) -> None:
    """The model calls the offered tool, named in tool_choice: the worker constrains the reply to one call in the
    model's tool-call format with arguments valid for the tool's schema, so the call is well-formed whatever the
    weights (the tiny model's differ by the CPU it was trained on); the reply is parsed into tool_calls."""
    question = "what is the weather in Paris?"
    messages = [{"role": "user", "content": question}]
    reply = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=TOOL_CALL_MAX_TOKENS,
    )
    choice = reply.choices[0]
    sys.stdout.write(f"> {question} (tools: get_weather)\n")
    calls = choice.message.tool_calls or []
    if len(calls) != 1 or not isinstance(json.loads(calls[0].function.arguments).get("city"), str):
        raise RuntimeError(f"the tool call was not well-formed: {choice.message}")
    for call in calls:
        sys.stdout.write(f"  tool call {call.id}: {call.function.name}({call.function.arguments})\n")
    sys.stdout.write(f"  content {choice.message.content!r} ({choice.finish_reason})\n")


def main() -> int:
    config = Config.from_env()
    configure_logging(config)
    stack = Stack(config, log_dir=REPO_ROOT / "var" / "logs", api_key=launcher_key(config, KEY_NAME))
    try:
        stack.start()
        client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key)
        model = client.models.list().data[0].id
        logger.info("model %s is served at %s/v1 (logs in var/logs/)", model, stack.base_url)
        stream_one(client, model)
        logger.info("%d concurrent non-streamed chats", len(QUESTIONS))
        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            for question, answer, finish_reason, seconds in pool.map(lambda q: ask(client, model, q), QUESTIONS):
                sys.stdout.write(f"> {question}\n  {answer!r} ({finish_reason}, {seconds:.2f} s)\n")
        call_a_tool(client, model)
        return 0
    finally:
        stack.stop()
        with make_session_factory(make_db_engine(config.database_url))() as session:
            revoke_key(session, KEY_NAME)
        logger.info("stack stopped")


if __name__ == "__main__":
    sys.exit(main())
