"""What OpenAI's and vLLM's clients send by default is accepted, vLLM's text and template fields do what they do in
vLLM, and the small endpoints (/tokenize, /detokenize, /version, GET /v1/files, x-request-id) answer as theirs do."""

from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
from openai import OpenAI
from sqlalchemy import update

from scripts.stack import Stack
from tasks.batches.models import FileRecord
from tasks.store.db import make_db_engine, make_session_factory
from tests.service.chat.test_openai_client import client_for
from tests.service.http import auth

MESSAGES = [{"role": "user", "content": "name a color"}]
SPECIAL = re.compile(r"<\|[a-z_]+\|>")
OPENAI_DEFAULTS = {
    "store": False,
    "metadata": {"run": "surface", "team": "tests"},
    "service_tier": "auto",
    "prompt_cache_key": "conversation-42",
    "safety_identifier": "user-hash-1",
    "reasoning_effort": "low",
    "verbosity": "medium",
    "prediction": {"type": "content", "content": "blue"},
    "modalities": ["text"],
    "user": "someone",
}
VLLM_DEFAULTS = {"skip_special_tokens": True, "spaces_between_special_tokens": True,
                 "include_stop_str_in_output": False, "request_id": "client-req-1"}  # fmt: skip


def test_openai_and_vllm_default_fields_are_accepted(stack: Stack) -> None:
    client = client_for(stack)
    template = {"add_generation_prompt": True, "continue_final_message": False, "chat_template_kwargs": {"x": 1}}
    reply = client.chat.completions.create(
        model=stack.config.model_name, messages=MESSAGES, max_tokens=4, parallel_tool_calls=True,
        **OPENAI_DEFAULTS, extra_body={**VLLM_DEFAULTS, **template},
    )  # fmt: skip
    assert reply.service_tier == "default" and reply._request_id == reply.id
    stored = httpx.get(f"{stack.base_url}/v1/requests/{reply.id}", headers=auth(stack)).json()
    assert stored["metadata"] == OPENAI_DEFAULTS["metadata"]
    completion = client.completions.create(
        model=stack.config.model_name, prompt="the dog", max_tokens=4, user="someone",
        extra_body={**OPENAI_DEFAULTS, **VLLM_DEFAULTS},
    )  # fmt: skip
    assert completion.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_an_unknown_field_is_refused_naming_it(stack: Stack, endpoint: str) -> None:
    client = client_for(stack)
    with pytest.raises(openai.BadRequestError) as caught:
        if endpoint == "chat":
            client.chat.completions.create(
                model=stack.config.model_name, messages=MESSAGES, extra_body={"frobnicate": 1}
            )
        else:
            client.completions.create(model=stack.config.model_name, prompt="x", extra_body={"frobnicate": 1})
    error = caught.value.body
    assert error["param"] == "frobnicate" and "frobnicate" in error["message"]


def greedy_chat(client: OpenAI, stack: Stack, **extra: object) -> str:
    reply = client.chat.completions.create(
        model=stack.config.model_name, messages=MESSAGES, max_tokens=40, temperature=0,
        extra_body={"ignore_eos": True, **extra},
    )  # fmt: skip
    return reply.choices[0].message.content or ""


def test_skip_special_tokens_false_shows_them(stack: Stack) -> None:
    client = client_for(stack)
    plain, shown = greedy_chat(client, stack), greedy_chat(client, stack, skip_special_tokens=False)
    assert SPECIAL.search(shown) and not SPECIAL.search(plain)
    assert SPECIAL.sub("", shown) == plain


def test_include_stop_str_in_output(stack: Stack) -> None:
    client = client_for(stack)

    def complete(**extra: object) -> tuple[str, str | None]:
        choice = client.completions.create(
            model=stack.config.model_name, prompt="the dog", max_tokens=30, temperature=0, extra_body=extra
        ).choices[0]
        return choice.text, choice.finish_reason

    natural, finish_reason = complete()
    assert len(natural) >= 4, natural
    middle = len(natural) // 2
    stop = natural[middle : middle + 2]  # two characters from the middle of the greedy text, whatever the model says
    cut = natural.index(stop)  # a stop string ends the text at its first occurrence
    assert complete(stop=[stop])[0] == natural[:cut]
    assert complete(stop=[stop], include_stop_str_in_output=True)[0] == natural[: cut + len(stop)]
    ended = complete(skip_special_tokens=False)[0]
    assert ended == natural
    if finish_reason == "stop":  # the model ended with EOS: its text is shown only when asked for, as in vLLM
        eos = "<|eot_id|>"
        assert eos not in ended
        assert complete(skip_special_tokens=False, include_stop_str_in_output=True)[0] == natural + eos


def tokenize(stack: Stack, **body: object) -> dict:
    reply = httpx.post(
        f"{stack.base_url}/tokenize", json={"model": stack.config.model_name, **body}, headers=auth(stack)
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_continue_final_message_and_add_generation_prompt(stack: Stack) -> None:
    client = client_for(stack)
    partial = [*MESSAGES, {"role": "assistant", "content": "How about"}]
    continued_ids = tokenize(stack, messages=partial, add_generation_prompt=False, continue_final_message=True)
    assert continued_ids["tokens"][-2:] != tokenize(stack, messages=partial)["tokens"][-2:]
    options = {"add_generation_prompt": False, "continue_final_message": True}
    chat = client.chat.completions.create(
        model=stack.config.model_name, messages=partial, max_tokens=8, temperature=0, extra_body=options
    )
    assert chat.usage.prompt_tokens == continued_ids["count"]
    same_prompt = client.completions.create(
        model=stack.config.model_name, prompt=continued_ids["tokens"], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.content == same_prompt.choices[0].text
    closed = client.chat.completions.create(
        model=stack.config.model_name, messages=MESSAGES, max_tokens=2, extra_body={"add_generation_prompt": False}
    )
    assert closed.usage.prompt_tokens == tokenize(stack, messages=MESSAGES, add_generation_prompt=False)["count"]
    assert closed.usage.prompt_tokens < tokenize(stack, messages=MESSAGES)["count"]


def test_tokenize_detokenize_and_version_over_http(stack: Stack) -> None:
    tokens = tokenize(stack, prompt="the dog sat")["tokens"]
    back = httpx.post(f"{stack.base_url}/detokenize", json={"tokens": tokens}, headers=auth(stack))
    assert back.json() == {"prompt": "<|begin_of_text|>the dog sat"}
    assert httpx.post(f"{stack.base_url}/tokenize", json={"prompt": "x"}).status_code == 401
    version = httpx.get(f"{stack.base_url}/version", headers=auth(stack)).json()["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", version)


def test_x_request_id_is_echoed_or_generated(stack: Stack) -> None:
    traced = OpenAI(
        base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, default_headers={"X-Request-Id": "t-1"}
    )
    assert traced.models.list()._request_id == "t-1"
    listing = client_for(stack).models.list()
    assert listing._request_id and listing._request_id.startswith("req_")


def test_files_list_pages_through_the_openai_client(stack: Stack) -> None:
    client = client_for(stack)
    mine = [client.files.create(file=(f"p{i}.jsonl", b"{}\n"), purpose="batch").id for i in range(5)]
    every_file = [file.id for file in client.files.list()]  # one page of up to 10,000
    paged = [file.id for file in client.files.list(limit=2)]  # auto-paginated, two at a time
    assert paged == every_file and len(set(paged)) == len(paged)
    assert [file_id for file_id in paged if file_id in mine] == mine[::-1]  # newest first
    oldest_first = [file.id for file in client.files.list(limit=3, order="asc")]
    assert oldest_first == every_file[::-1]


def test_an_expiring_file_is_deleted_by_the_workers_reaper(stack: Stack) -> None:
    client = client_for(stack)
    policy = {"anchor": "created_at", "seconds": 3600}
    created = client.files.create(file=("e.jsonl", b"{}\n"), purpose="batch", expires_after=policy)
    assert created.expires_at == created.created_at + 3600
    sessions = make_session_factory(make_db_engine(stack.config.database_url))
    with sessions() as session:  # an hour is OpenAI's shortest expiry: make this one due now
        session.execute(update(FileRecord).where(FileRecord.id == created.id).values(expires_at=int(time.time())))
        session.commit()
    deadline = time.monotonic() + 4 * stack.config.batch_reaper_interval_s + 10
    while True:
        with sessions() as session:
            if session.get(FileRecord, created.id) is None:
                break
        assert time.monotonic() < deadline, "the reaper did not delete the expired file"
        time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
