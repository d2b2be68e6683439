"""openai-agents (tracing off) keeping its memory in this server's conversations: a session over the Conversations
API, and runs given a conversation id; each second run sees the first."""

from __future__ import annotations

import asyncio

import agents
from openai import AsyncOpenAI

from scripts.stack import Stack
from tests.service.batch_helpers import client_for


def agent_for(stack: Stack) -> tuple[agents.Agent, AsyncOpenAI]:
    agents.set_tracing_disabled(True)  # tracing would upload each run to OpenAI
    client = AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, timeout=120)
    model = agents.OpenAIResponsesModel(model=stack.config.model_name, openai_client=client)
    settings = agents.ModelSettings(max_tokens=60, temperature=0)
    # A boolean answer is a short JSON object whose grammar ends the reply, so every run completes (agents treats an
    # incomplete response as a failure), whatever the weights.
    agent = agents.Agent(name="rememberer", model=model, model_settings=settings, output_type=bool)
    return agent, client


def user_texts(items: list) -> list[str]:
    return ["".join(part.text for part in item.content) for item in items if getattr(item, "role", "") == "user"]


def assert_second_run_saw_the_first(stack: Stack, second: agents.RunResult) -> None:
    """The response of the second run was given the first run's turn before its own input."""
    response_id = second.raw_responses[-1].response_id
    assert response_id is not None
    given = client_for(stack).responses.input_items.list(response_id, order="asc")
    assert user_texts(given.data) == ["my name is Ann", "what is my name?"]
    assert [item.role for item in given.data if item.type == "message"] == ["user", "assistant", "user"]


def test_a_conversations_session_remembers_the_first_run(stack: Stack) -> None:
    agent, client = agent_for(stack)
    session = agents.OpenAIConversationsSession(openai_client=client)

    async def two_runs() -> agents.RunResult:
        await agents.Runner.run(agent, "my name is Ann", session=session, max_turns=1)
        return await agents.Runner.run(agent, "what is my name?", session=session, max_turns=1)

    assert_second_run_saw_the_first(stack, asyncio.run(two_runs()))
    items = list(client_for(stack).conversations.items.list(session.session_id, order="asc"))
    assert user_texts(items) == ["my name is Ann", "what is my name?"]
    assert [item.role for item in items if item.type == "message"] == ["user", "assistant", "user", "assistant"]


def test_runs_given_a_conversation_id_continue_it(stack: Stack) -> None:
    agent, _ = agent_for(stack)
    sync_client = client_for(stack)
    conversation = sync_client.conversations.create()

    async def two_runs() -> agents.RunResult:
        await agents.Runner.run(agent, "my name is Ann", conversation_id=conversation.id, max_turns=1)
        return await agents.Runner.run(agent, "what is my name?", conversation_id=conversation.id, max_turns=1)

    assert_second_run_saw_the_first(stack, asyncio.run(two_runs()))
    items = list(sync_client.conversations.items.list(conversation.id, order="asc"))
    assert user_texts(items) == ["my name is Ann", "what is my name?"]
    assert [item.role for item in items if item.type == "message"] == ["user", "assistant", "user", "assistant"]
