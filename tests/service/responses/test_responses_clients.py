"""The Responses API as real clients call it: openai-agents' default model (which always sends `include`), the fields
OpenAI's SDKs and agents send by default, logprobs asked through `include`, and earlier output items replayed as
input with fields this server never sets."""

from __future__ import annotations

import asyncio

import agents
from openai import AsyncOpenAI

from scripts.stack import Stack
from tests.service.batch_helpers import client_for

LOGPROBS = "message.output_text.logprobs"


def test_openai_agents_runs_its_default_model(stack: Stack) -> None:
    agents.set_tracing_disabled(True)  # tracing would upload each run to OpenAI
    client = AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, timeout=120)
    model = agents.OpenAIResponsesModel(model=stack.config.model_name, openai_client=client)
    settings = agents.ModelSettings(max_tokens=6, temperature=0)
    agent = agents.Agent(name="namer", instructions="be brief", model=model, model_settings=settings)
    result = asyncio.run(agents.Runner.run(agent, "name a color", max_turns=1))
    assert isinstance(result.final_output, str)


def test_default_fields_are_accepted(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    response = client.responses.create(
        model=model,
        input="name a color",
        max_output_tokens=4,
        include=[],
        service_tier="auto",
        prompt_cache_key="k",
        safety_identifier="user-1",
        max_tool_calls=3,
        prompt_cache_retention="24h",
        text={"verbosity": "low"},
        temperature=None,
        top_p=None,
        stream_options=None,
    )
    assert response.status in ("completed", "incomplete") and response.max_tool_calls == 3


def test_include_logprobs_gives_the_texts_logprobs(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    asked = {"model": model, "input": "name a color", "max_output_tokens": 5, "temperature": 0}
    response = client.responses.create(**asked, include=[LOGPROBS], top_logprobs=2)
    (part,) = response.output[0].content
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "name a color"}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    assert chat.choices[0].logprobs is not None
    expected = [entry.model_dump() for entry in chat.choices[0].logprobs.content]
    assert [entry.model_dump() for entry in part.logprobs] == expected and part.text == chat.choices[0].message.content
    streamed = list(client.responses.create(**asked, include=[LOGPROBS], top_logprobs=2, stream=True))
    deltas = [entry.model_dump() for e in streamed if e.type == "response.output_text.delta" for entry in e.logprobs]
    assert deltas == expected
    (done,) = [e for e in streamed if e.type == "response.output_text.done"]
    assert [entry.model_dump() for entry in done.logprobs] == expected


def test_replayed_output_items_are_valid_input(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    first = client.responses.create(model=model, input="name a color", max_output_tokens=4, temperature=0)
    replayed = [item.model_dump() for item in first.output]
    for item in replayed:
        item["phase"] = "final_answer"  # set by newer OpenAI models, unknown here
    second = client.responses.create(
        model=model,
        input=[{"role": "user", "content": "name a color"}, *replayed, {"role": "user", "content": "another"}],
        max_output_tokens=4,
    )
    assert second.status in ("completed", "incomplete")


def test_a_responses_input_items_are_listed(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    first = client.responses.create(model=model, input="my name is Ann", max_output_tokens=3, temperature=0)
    given = [{"role": "user", "content": "and yours?"}, {"role": "user", "content": "tell me"}]
    second = client.responses.create(model=model, previous_response_id=first.id, input=given, max_output_tokens=3)
    listed = client.responses.input_items.list(second.id)
    texts = [item.content[0].text for item in listed.data if item.type == "message" and item.role == "user"]
    assert texts == ["tell me", "and yours?", "my name is Ann"]  # newest first, the earlier turn's input included
    assert len({item.id for item in listed.data}) == len(listed.data) and not listed.has_more
    oldest = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert [item.id for item in oldest.data] == [listed.data[-1].id] and oldest.has_more
    after = client.responses.input_items.list(second.id, order="asc", after=oldest.data[0].id)
    assert [item.id for item in after.data] == [item.id for item in reversed(listed.data[:-1])]
