"""The GPU check's step (e): the whole stack started on one device (gunicorn, a Celery worker holding the tiny model,
embedded Redis, SQLite) and used as a client would, with the `openai` client: a chat, a streamed chat, a steered chat,
a forced tool call, a JSON-schema structured output, and a 64-line batch. Each check passes or fails on its own; the
markdown table (--out) says which, and the exit status is 1 if any failed.

    python3 -m scripts.gpu.service_check --device cuda --model gpu-bundle/models/tiny --out service.md
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openai import OpenAI

from bench.service.batch_stack import (
    bench_config,
    client_for,
    completion_lines,
    create_batch,
    random_prompts,
    running_stack,
)
from bench.workload import WorkloadSpec
from scripts.stack import Stack
from tasks.config import Config

logger = logging.getLogger("scripts.gpu.service_check")
BATCH_LINES = 64
BATCH_ENDS = ("completed", "failed", "expired", "cancelled")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PERSON_SCHEMA = {
    "type": "object",
    # bounded, so that whatever a model's weights prefer, the object closes well within the check's max_tokens
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "tell me about cats"}]


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    passed: bool
    seconds: float
    detail: str


def chat(client: OpenAI, model: str, config: Config) -> str:
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=24, temperature=0)
    assert reply.usage is not None and reply.usage.completion_tokens > 0, reply
    return f"{reply.usage.completion_tokens} tokens, finish {reply.choices[0].finish_reason}"


def streamed_chat(client: OpenAI, model: str, config: Config) -> str:
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert finishes and usage is not None and usage.completion_tokens > 0, chunks[-3:]
    return f"{len(chunks)} chunks, {usage.completion_tokens} tokens, finish {finishes[-1]}"


def steered_chat(client: OpenAI, model: str, config: Config) -> str:
    """The tiny SAE's first constructed feature, at its demo strength, makes its token the first one generated."""
    sae_id = "tiny/resid_post_2"
    feature = json.loads((Path(config.sae_root) / sae_id / "steering_demo.json").read_text())["features"][0]
    steering = {"sae_id": sae_id, "features": [{"index": feature["index"], "strength": feature["strength"]}]}
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"steering": steering}
    )
    content = reply.choices[0].message.content or ""
    assert content.lstrip().startswith(feature["token"].strip()), content
    return f"steered toward {feature['token']!r}: {content!r}"


def tool_call(client: OpenAI, model: str, config: Config) -> str:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "what is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather", reply
    arguments = json.loads(calls[0].function.arguments)
    assert isinstance(arguments.get("city"), str), arguments
    return f"get_weather({calls[0].function.arguments})"


def structured_output(client: OpenAI, model: str, config: Config) -> str:
    schema = {"name": "person", "schema": PERSON_SCHEMA, "strict": True}
    response_format = {"type": "json_schema", "json_schema": schema}
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=96, temperature=0, response_format=response_format
    )
    assert reply.choices[0].finish_reason == "stop", reply
    person = json.loads(reply.choices[0].message.content or "")
    assert isinstance(person["name"], str) and isinstance(person["age"], int) and set(person) == {"name", "age"}
    return json.dumps(person)


def batch(client: OpenAI, model: str, config: Config, stack: Stack) -> str:
    requests = random_prompts(config, WorkloadSpec(BATCH_LINES, (16, 64), (16, 16), seed=0))
    created = create_batch(stack, completion_lines(config, requests))
    deadline = time.monotonic() + 240
    while (current := client.batches.retrieve(created.id)).status not in BATCH_ENDS:
        assert time.monotonic() < deadline, f"batch still {current.status} after 240 s"
        time.sleep(1.0)
    assert current.status == "completed" and current.output_file_id, current
    lines = [json.loads(line) for line in client.files.content(current.output_file_id).text.splitlines()]
    statuses = sorted({line["response"]["status_code"] for line in lines})
    assert len(lines) == BATCH_LINES and statuses == [200], (len(lines), statuses)
    return f"{len(lines)} lines, all 200"


CHECKS: dict[str, Callable[..., str]] = {
    "chat": chat,
    "streamed chat": streamed_chat,
    "steered chat": steered_chat,
    "forced tool call": tool_call,
    "structured output (json_schema)": structured_output,
}


def run_check(name: str, check: Callable[[], str]) -> CheckOutcome:
    started = time.perf_counter()
    try:
        detail, passed = check(), True
    except Exception:  # each check fails alone, with its traceback in the report
        detail, passed = traceback.format_exc(), False
        logger.error("%s failed:\n%s", name, detail)
    return CheckOutcome(name, passed, time.perf_counter() - started, detail)


def run_all(config: Config) -> list[CheckOutcome]:
    with running_stack(config) as stack:
        client = client_for(stack)
        model = client.models.list().data[0].id
        outcomes = [run_check(name, lambda check=check: check(client, model, config)) for name, check in CHECKS.items()]
        outcomes.append(run_check(f"{BATCH_LINES}-line batch", lambda: batch(client, model, config, stack)))
    return outcomes


def table(outcomes: list[CheckOutcome], config: Config) -> str:
    lines = [f"Stack on {config.device}: model {config.model}, SQLite, embedded Redis.", ""]
    lines += ["| check | result | seconds | detail |", "|---|---|---:|---|"]
    for outcome in outcomes:
        detail = outcome.detail if outcome.passed else outcome.detail.strip().splitlines()[-1]
        result = "passed" if outcome.passed else "FAILED"
        lines.append(f"| {outcome.name} | {result} | {outcome.seconds:.1f} | {detail} |")
    failed = [outcome for outcome in outcomes if not outcome.passed]
    for outcome in failed:
        lines += ["", f"### {outcome.name}", "", "```", outcome.detail.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = bench_config(str(args.model), device=args.device, sae_root=str(args.model.parent / "saes"))
    outcomes = run_all(config)
    report = table(outcomes, config)
    args.out.write_text(report)
    print(report)
    return 0 if all(outcome.passed for outcome in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
