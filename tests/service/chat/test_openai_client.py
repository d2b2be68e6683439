"""The official `openai` client works against the service unchanged."""

from __future__ import annotations

from openai import OpenAI

from scripts.stack import Stack


def client_for(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, timeout=120)


def test_chat_create(stack: Stack) -> None:
    client = client_for(stack)
    reply = client.chat.completions.create(
        model=stack.config.model_name, messages=[{"role": "user", "content": "name a color"}], max_tokens=10, seed=3
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage is not None and reply.usage.completion_tokens >= 1


def test_chat_stream(stack: Stack) -> None:
    client = client_for(stack)
    stream = client.chat.completions.create(
        model=stack.config.model_name,
        messages=[{"role": "user", "content": "name a color"}],
        max_completion_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_completions_and_models(stack: Stack) -> None:
    client = client_for(stack)
    assert [m.id for m in client.models.list().data] == [stack.config.model_name]
    reply = client.completions.create(model=stack.config.model_name, prompt="the dog", max_tokens=6, temperature=0)
    assert reply.object == "text_completion" and reply.choices[0].finish_reason in ("stop", "length")
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=stack.config.model_name, prompt="the dog", max_tokens=6, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == reply.choices[0].text


def test_seeded_sampling_repeats(stack: Stack) -> None:
    client = client_for(stack)
    texts = {
        client.completions.create(
            model=stack.config.model_name, prompt="the dog", max_tokens=12, temperature=1.0, seed=1234
        )
        .choices[0]
        .text
        for _ in range(3)
    }
    assert len(texts) == 1
