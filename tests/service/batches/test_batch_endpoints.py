"""Batch lines beyond chat and completions, through the openai client's files and batches API: embeddings lines
answered as /v1/embeddings answers (float and base64, the same vectors), responses lines as /v1/responses answers
(a response object: text, function calls, usage), and legacy `functions` answered as the interactive chat endpoint
answers them (`function_call` in the message)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, client_for, read_jsonl, submit, wait_for_end
from tests.service.structured.test_structured_outputs import TOOLS, ask


@pytest.mark.parametrize("function_call", [None, {"name": "add_numbers"}])
def test_a_legacy_functions_line_is_answered_as_the_interactive_endpoint_answers(
    stack: Stack, function_call: dict | None
) -> None:
    body = {"messages": ask("add 3 and 4"), "functions": [tool["function"] for tool in TOOLS], "max_tokens": 80,
            "logit_bias": {"537": 30, "402": 30, "35": 30}}  # fmt: skip
    if function_call is not None:
        body["function_call"] = function_call
    line = chat_line(stack, "legacy", **body)
    # the interactive endpoint's answer to the same body is what the batch line must equal
    interactive = client_for(stack).chat.completions.create(**line["body"]).choices[0]
    batch = wait_for_end(stack, submit(stack, [line]))
    assert batch.status == "completed" and batch.request_counts.completed == 1, batch
    [output] = read_jsonl(stack, batch.output_file_id)
    choice = output["response"]["body"]["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["message"]["function_call"] is not None
    assert choice["message"]["function_call"] == interactive.message.function_call.model_dump()
    assert choice["finish_reason"] == interactive.finish_reason == ("stop" if function_call else "function_call")


def embeddings_line(stack: Stack, custom_id: str, **body: object) -> dict:
    body = {"model": stack.config.model_name, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}


def test_embeddings_lines_get_the_vectors_the_endpoint_gives(stack: Stack) -> None:
    texts = ["the dog ran", "a bird sang all day"]
    lines = [
        embeddings_line(stack, "floats", input=texts, encoding_format="float"),
        embeddings_line(stack, "packed", input=texts[:1], encoding_format="base64", dimensions=16),
        embeddings_line(stack, "too-wide", input="x", dimensions=129),
    ]
    batch = wait_for_end(stack, submit(stack, lines, endpoint="/v1/embeddings"))
    assert batch.status == "completed" and batch.request_counts.completed == 2, batch
    outputs = {line["custom_id"]: line["response"] for line in read_jsonl(stack, batch.output_file_id)}
    [error] = read_jsonl(stack, batch.error_file_id)
    assert error["custom_id"] == "too-wide" and error["error"]["param"] == "dimensions"
    client = client_for(stack)
    floats = outputs["floats"]["body"]
    interactive = client.embeddings.create(model=stack.config.model_name, input=texts, encoding_format="float")
    assert floats == interactive.model_dump(exclude_unset=True) and outputs["floats"]["status_code"] == 200
    [packed] = outputs["packed"]["body"]["data"]
    short = client.embeddings.create(model=stack.config.model_name, input=texts[:1], dimensions=16,
                                     encoding_format="float")  # fmt: skip
    assert np.frombuffer(base64.b64decode(packed["embedding"]), "<f4").tolist() == short.data[0].embedding


def responses_line(stack: Stack, custom_id: str, **body: object) -> dict:
    body = {"model": stack.config.model_name, "max_output_tokens": 12, "temperature": 0, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}


def test_responses_lines_get_the_response_object_the_endpoint_gives(stack: Stack) -> None:
    tools = [{"type": "function", "name": tool["function"]["name"], "parameters": tool["function"]["parameters"]}
             for tool in TOOLS if tool["function"]["name"] == "get_weather"]  # fmt: skip
    lines = [
        responses_line(stack, "text", input="name a color", instructions="Answer briefly.", metadata={"k": "v"}),
        responses_line(
            stack,
            "call",
            input="what is the weather in Rome?",
            tools=tools,
            tool_choice="required",
            max_output_tokens=80,
        ),
        responses_line(stack, "chained", input="and then?", previous_response_id="resp_abc"),
    ]
    client = client_for(stack)
    # the interactive endpoint's answers to the same bodies are what the batch lines must equal
    interactive = {line["custom_id"]: client.responses.create(**line["body"], store=False) for line in lines[:2]}
    batch = wait_for_end(stack, submit(stack, lines, endpoint="/v1/responses"))
    assert batch.status == "completed" and batch.request_counts.completed == 2, batch
    outputs = {line["custom_id"]: line["response"]["body"] for line in read_jsonl(stack, batch.output_file_id)}
    [error] = read_jsonl(stack, batch.error_file_id)
    assert error["custom_id"] == "chained" and error["error"]["param"] == "previous_response_id"
    for custom_id, reference in interactive.items():
        body = outputs[custom_id]
        assert body["object"] == "response" and body["status"] == reference.status == "completed"
        counts = ("input_tokens", "output_tokens", "total_tokens")
        assert [body["usage"][key] for key in counts] == [getattr(reference.usage, key) for key in counts]
        assert body["instructions"] == reference.instructions and body["metadata"] == reference.metadata
        mine = [
            {k: v for k, v in item.items() if k not in ("id", "call_id") and v is not None} for item in body["output"]
        ]
        theirs = [item.model_dump(exclude={"id", "call_id"}, exclude_none=True) for item in reference.output]
        assert mine == theirs
    assert [item["type"] for item in outputs["call"]["output"]][-1] == "function_call"
