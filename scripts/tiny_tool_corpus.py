"""Tool-use and JSON chats for the tiny model: it learns to call the tools a chat offers (Hermes-style
`<tool_call>` blocks, rendered by the chat template), to answer from a tool's result, to answer plainly when no
offered tool fits, and to write small JSON objects. Stdlib only, deterministic for a seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

try:
    from scripts import tiny_corpus
except ImportError:  # run as a file: scripts/ itself is on sys.path
    import tiny_corpus

Message = dict[str, Any]
ToolChat = tuple[list[dict[str, Any]], list[Message]]  # (tools offered, or [] for none; messages)
Call = tuple[str, dict[str, Any]]  # (function name, arguments)

CITIES = sorted(tiny_corpus.CAPITALS.values())
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TWO_NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
TOOLS = {
    "get_weather": {"description": "Get the current weather in a city.", "parameters": CITY},
    "get_time": {"description": "Get the local time in a city.", "parameters": CITY},
    "add_numbers": {"description": "Add two whole numbers.", "parameters": TWO_NUMBERS},
}
WEATHER_QUESTIONS = ["what is the weather in {c}?", "What is the weather like in {c}?", "is it raining in {c}?"]
TIME_QUESTIONS = ["what time is it in {c}?", "What is the time in {c}?"]
ADD_QUESTIONS = ["add {a} and {b}", "please add {a} and {b}", "what is {a} added to {b}?"]


def tool_schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **TOOLS[name]}}


def weather_call(rng: random.Random) -> tuple[str, list[Call], str]:
    city = rng.choice(CITIES)
    return rng.choice(WEATHER_QUESTIONS).format(c=city), [("get_weather", {"city": city})], city


def time_call(rng: random.Random) -> tuple[str, list[Call], str]:
    city = rng.choice(CITIES)
    return rng.choice(TIME_QUESTIONS).format(c=city), [("get_time", {"city": city})], city


def add_call(rng: random.Random) -> tuple[str, list[Call], str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return rng.choice(ADD_QUESTIONS).format(a=a, b=b), [("add_numbers", {"a": a, "b": b})], ""


def two_cities_call(rng: random.Random) -> tuple[str, list[Call], str]:
    first, second = rng.sample(CITIES, 2)
    calls = [("get_weather", {"city": first}), ("get_weather", {"city": second})]
    return f"what is the weather in {first} and {second}?", calls, first


CALLERS: list[Callable[[random.Random], tuple[str, list[Call], str]]] = [
    weather_call,
    weather_call,
    time_call,
    add_call,
    two_cities_call,
]


def tool_result(rng: random.Random, name: str, arguments: dict[str, Any]) -> tuple[str, str]:
    """What the tool returns, and how the assistant says it."""
    if name == "get_weather":
        weather = rng.choice(tiny_corpus.WEATHER)
        return json.dumps({"city": arguments["city"], "weather": weather}), f"It is {weather} in {arguments['city']}."
    if name == "get_time":
        time = f"{rng.randint(1, 12)}:{rng.choice(['00', '15', '30', '45'])}"
        return json.dumps({"city": arguments["city"], "time": time}), f"It is {time} in {arguments['city']}."
    total = arguments["a"] + arguments["b"]
    return json.dumps({"sum": total}), f"{arguments['a']} plus {arguments['b']} is {total}."


def build_tool_chat(rng: random.Random) -> ToolChat:
    """A question one offered tool answers (a call, then often its result and the answer), or a question none does
    (a plain answer)."""
    question, calls, _ = rng.choice(CALLERS)(rng)
    needed = {name for name, _ in calls}
    others = [name for name in sorted(TOOLS) if name not in needed]
    # shuffled from name order: a set's own order follows string hashing, which differs per process
    offered = sorted(sorted(needed | set(rng.sample(others, rng.randint(0, len(others))))), key=lambda _: rng.random())
    if rng.random() < 0.25:  # no offered tool fits: answer as any chat would
        plain_question, answer = rng.choice(tiny_corpus.ASKERS)(rng)
        return [tool_schema(name) for name in offered], [user(plain_question), assistant(answer)]
    tool_calls = [{"type": "function", "function": {"name": name, "arguments": args}} for name, args in calls]
    messages = [user(question), {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    if len(calls) == 1 and rng.random() < 0.5:
        result, answer = tool_result(rng, *calls[0])
        messages += [{"role": "tool", "content": result}, assistant(answer)]
    return [tool_schema(name) for name in offered], messages


def build_json_chat(rng: random.Random) -> ToolChat:
    """A person, described as a JSON object."""
    name = rng.choice(tiny_corpus.NAMES)
    person = {"name": name, "age": rng.randint(2, 90), "city": rng.choice(CITIES)}
    if rng.random() < 0.5:
        person["likes"] = rng.sample(tiny_corpus.FOODS, rng.randint(1, 3))
    question = rng.choice(["describe {n} as JSON", "give me {n} as a JSON object", "write JSON about {n}"])
    return [], [user(question.format(n=name)), assistant(json.dumps(person))]


def build_tool_chats(num_chats: int, seed: int) -> list[ToolChat]:
    rng = random.Random(seed + 2)
    return [build_tool_chat(rng) if rng.random() < 0.75 else build_json_chat(rng) for _ in range(num_chats)]


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def iter_tool_chat_texts(chats: list[ToolChat]) -> Iterator[str]:
    """The text of every chat as the template writes it, less special tokens, for the tokenizer."""
    for tools, messages in chats:
        yield "\n".join(json.dumps(tool["function"]) for tool in tools)
        for message in messages:
            calls = message.get("tool_calls") or []
            written = [
                json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}) for c in calls
            ]
            yield message["content"] + "".join(f"<tool_call>\n{text}\n</tool_call>" for text in written)
