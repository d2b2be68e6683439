"""The Conversations API through the whole stack with the `openai` client: a conversation and its items (created,
paged, retrieved, deleted), responses that run in a conversation and see its earlier turns, its errors and its
tenancy."""

from __future__ import annotations

import time

import openai
import pytest
import requests

from scripts.stack import Stack
from tests.service.batch_helpers import client_for
from tests.service.conftest import TenantKeys

pytestmark = pytest.mark.postgres  # on both databases: conversations and their items are SQL rows


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def texts(items: list) -> list[tuple[str, str]]:
    """(role, text) of each message item."""
    return [(item.role, "".join(part.text for part in item.content)) for item in items if item.type == "message"]


def test_a_conversation_and_its_items(stack: Stack) -> None:
    client = client_for(stack)
    conversation = client.conversations.create(items=[user("one"), user("two")], metadata={"topic": "counting"})
    assert conversation.object == "conversation" and conversation.metadata == {"topic": "counting"}
    assert client.conversations.retrieve(conversation.id).created_at == conversation.created_at
    updated = client.conversations.update(conversation.id, metadata={"topic": "numbers"})
    assert updated.metadata == {"topic": "numbers"}
    added = client.conversations.items.create(conversation.id, items=[user("three"), user("four")])
    assert texts(added.data) == [("user", "three"), ("user", "four")] and not added.has_more
    # auto-paging one item a page, oldest first and newest first
    paged = list(client.conversations.items.list(conversation.id, limit=1, order="asc"))
    assert texts(paged) == [("user", text) for text in ("one", "two", "three", "four")]
    newest_first = client.conversations.items.list(conversation.id, limit=2)
    assert texts(newest_first.data) == [("user", "four"), ("user", "three")] and newest_first.has_more
    assert len({item.id for item in paged}) == 4 and all(item.status == "completed" for item in paged)
    one = client.conversations.items.retrieve(paged[1].id, conversation_id=conversation.id)
    assert (one.id, texts([one])) == (paged[1].id, [("user", "two")])
    after_delete = client.conversations.items.delete(paged[1].id, conversation_id=conversation.id)
    assert after_delete.id == conversation.id
    remaining = client.conversations.items.list(conversation.id, order="asc", include=["message.output_text.logprobs"])
    assert texts(remaining.data) == [("user", "one"), ("user", "three"), ("user", "four")]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(paged[1].id, conversation_id=conversation.id)
    deleted = client.conversations.delete(conversation.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (conversation.id, "conversation.deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conversation.id)


def test_a_second_turn_sees_the_first(stack: Stack) -> None:
    """The second response's prompt is the first turn, then its own input: the engine's token count says so (the
    same history sent whole through chat counts as many), as do the items both responses were given."""
    client, model = client_for(stack), stack.config.model_name
    conversation = client.conversations.create()
    first = client.responses.create(
        model=model, conversation=conversation.id, input="my name is Ann", max_output_tokens=8, temperature=0
    )
    assert first.conversation is not None and first.conversation.id == conversation.id
    second = client.responses.create(
        model=model, conversation={"id": conversation.id}, input="what is my name?", max_output_tokens=8,
        temperature=0,
    )  # fmt: skip
    history = [("user", "my name is Ann"), ("assistant", first.output_text), ("user", "what is my name?")]
    given = client.responses.input_items.list(second.id, order="asc")
    assert texts(given.data) == history
    messages = [{"role": role, "content": text} for role, text in history]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    assert chat.usage is not None and second.usage is not None and first.usage is not None
    assert second.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens
    assert second.output_text == chat.choices[0].message.content
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert texts(items) == [*history, ("assistant", second.output_text)]
    assert [item.id for item in items if item.type == "message" and item.role == "assistant"] == [
        first.output[0].id,
        second.output[0].id,
    ]


def test_streamed_and_background_turns_join_once_they_end(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    conversation = client.conversations.create(items=[user("count to three")])
    events = list(client.responses.create(model=model, conversation=conversation.id, input="go", stream=True,
                                          max_output_tokens=6, temperature=0))  # fmt: skip
    streamed = events[-1].response
    background = client.responses.create(
        model=model, conversation=conversation.id, input="again", background=True, max_output_tokens=6, temperature=0
    )
    deadline = time.monotonic() + 120
    while (background := client.responses.retrieve(background.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, "the background response did not end"
        time.sleep(0.2)
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    expected = [("user", "count to three"), ("user", "go"), ("assistant", streamed.output_text), ("user", "again"),
                ("assistant", background.output_text)]  # fmt: skip
    assert texts(items) == expected
    store_false = client.responses.create(
        model=model, conversation=conversation.id, input="last", store=False, max_output_tokens=6, temperature=0
    )
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert texts(items) == [*expected, ("user", "last"), ("assistant", store_false.output_text)]


def test_conversation_errors(stack: Stack) -> None:
    client, model = client_for(stack), stack.config.model_name
    conversation = client.conversations.create()
    first = client.responses.create(model=model, input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=model, input="hi", conversation=conversation.id, previous_response_id=first.id, max_output_tokens=2
        )
    assert "previous_response_id" in raised.value.body["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=model, input="hi", conversation="conv_missing", max_output_tokens=2)
    assert (missing.value.body["param"], missing.value.body["code"]) == ("conversation", "not_found")
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve("msg_missing", conversation_id=conversation.id)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.conversations.items.create(conversation.id, items=[user(str(i)) for i in range(21)])
    assert too_many.value.body["param"] == "items"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.conversations.create(extra_body={"title": "x"})
    assert unknown.value.body["param"] == "title"


def test_another_tenant_sees_none_of_a_tenants_conversations(stack: Stack, tenant_keys: TenantKeys) -> None:
    as_a, as_b = client_for(stack, tenant_keys.a), client_for(stack, tenant_keys.b)
    conversation = as_a.conversations.create(items=[user("secret")])
    item_id = as_a.conversations.items.list(conversation.id).data[0].id
    base = f"{stack.base_url}/v1/conversations/{conversation.id}"
    headers = {"Authorization": f"Bearer {tenant_keys.b}"}
    update, add = {"metadata": None}, {"items": [user("x")]}
    for method, url, body in (
        ("GET", base, None),
        ("POST", base, update),
        ("DELETE", base, None),
        ("GET", f"{base}/items", None),
        ("POST", f"{base}/items", add),
        ("GET", f"{base}/items/{item_id}", None),
        ("DELETE", f"{base}/items/{item_id}", None),
    ):
        answer = requests.request(method, url, headers=headers, json=body, timeout=30)
        assert answer.status_code == 404, (method, url)
    with pytest.raises(openai.NotFoundError):
        as_b.responses.create(model=stack.config.model_name, input="hi", conversation=conversation.id)
    assert texts(as_a.conversations.items.list(conversation.id).data) == [("user", "secret")]
