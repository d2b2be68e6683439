"""OpenAI's and vLLM's extra fields: what validation accepts and refuses, and what the chat template is given."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import PreTrainedTokenizerFast

from api.chat.prompts import chat_prompt_ids
from api.chat.schemas import ChatCompletionRequest, ChatMessage
from api.errors import validation_error_info

MESSAGES = [{"role": "user", "content": "hi"}]


def refusal(**fields: object) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate({"model": "tiny", "messages": MESSAGES, **fields})
    info = validation_error_info(caught.value)
    return info.param, info.message


def test_bounded_values_are_refused_naming_the_field() -> None:
    assert refusal(metadata={f"k{i}": "v" for i in range(17)})[0] == "metadata"
    assert refusal(metadata={"k" * 65: "v"})[0].startswith("metadata")
    assert refusal(service_tier="gold")[0] == "service_tier"
    assert refusal(modalities=["text", "audio"])[0] == "modalities.1"
    assert refusal(reasoning_effort="extreme")[0] == "reasoning_effort"
    assert refusal(request_id="x" * 257)[0] == "request_id"
    assert refusal(prediction={"type": "content"})[0] == "prediction.content"
    assert refusal(chat_template_kwargs={"tools": []})[0] == "chat_template_kwargs"
    assert refusal(chat_template_kwargs={"not a name": 1})[0] == "chat_template_kwargs"
    assert refusal(chat_template_kwargs={"big": "x" * 20_000})[0] == "chat_template_kwargs"
    assert "add_generation_prompt" in refusal(continue_final_message=True)[1]
    assert refusal(audio={"voice": "alloy"}) == ("audio", "Unrecognized request argument supplied: audio")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)


def test_chat_template_kwargs_reach_the_template(tokenizer: PreTrainedTokenizerFast) -> None:
    greeting = copy.deepcopy(tokenizer)
    greeting.chat_template = (
        "{% if greeting %}{{ greeting }}: {% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    messages = [ChatMessage(role="user", content="hi")]

    def rendered(**kwargs: object) -> str:
        fields = ChatCompletionRequest.model_validate({"model": "tiny", "messages": MESSAGES, **kwargs})
        return greeting.decode(chat_prompt_ids(greeting, messages, template=fields))

    assert rendered() == "hi"
    assert rendered(chat_template_kwargs={"greeting": "hello there"}) == "hello there: hi"
