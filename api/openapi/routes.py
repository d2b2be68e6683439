"""The route table: every view's contract, keyed by its Flask endpoint name ("<blueprint>.<function>"). A new route
is one more entry here; tests/api/openapi/test_openapi.py fails while a route of the app has none."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from api.batches import file_routes
from api.batches.batch_routes import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, BatchCreate
from api.chat.schemas import ChatCompletionRequest, CompletionRequest
from api.chat.tokenize_routes import Detokenize
from api.conversations.schemas import ConversationCreateRequest, ConversationUpdateRequest, ItemsCreateRequest
from api.embeddings.schemas import EmbeddingRequest
from api.gate.idempotency import MAX_KEY_LENGTH
from api.messages.schemas import MessageCountTokensRequest, MessageCreateRequest
from api.openapi import completion_objects as gen
from api.openapi import conversation_objects as conv
from api.openapi import embedding_objects as emb
from api.openapi import messages_api_objects as msg
from api.openapi import resource_objects as res
from api.openapi import responses_api_objects as resp
from api.openapi import server_objects as srv
from api.openapi.operation import Operation, header, query
from api.responses.schemas import ResponseCreateRequest
from api.steering.schemas import SteeringBody, WorkerMonitorBody

IDEMPOTENCY_KEY = header(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
    "A retry with the same key returns the first object.",
)
EVENT_ID = {"type": "string", "pattern": r"^(\d+-\d+)?$"}  # empty: from the start
LAST_EVENT_ID = (
    header("Last-Event-ID", EVENT_ID, "Resume after this stream entry id (e.g. 1700000000000-0)"),
    query("last_event_id", EVENT_ID, "As Last-Event-ID, for curl; checked whenever given, the header wins"),
)
PROFILE_SCOPE = query(
    "scope",
    {"type": "string", "enum": ["tenant", "worker"]},
    "Whose profile: the caller's tenant's own, or the worker-wide one (the default for an admin key)",
)
SEQUENCE_NUMBER = {"type": "string", "pattern": r"^[0-9]{0,18}$"}  # empty: from the start
RESPONSE_STREAM = (
    query(
        "stream",
        {"type": "string", "pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$", "default": "false"},
        "true: the response's typed events (from its start, or after starting_after) instead of the object",
    ),
    query("starting_after", SEQUENCE_NUMBER, "With stream: resume after this event's sequence_number"),
    header("Last-Event-ID", SEQUENCE_NUMBER, "As starting_after, for an EventSource; read only without it"),
)
FILE_LIST = (
    query(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": file_routes.MAX_LIST_LIMIT, "default": file_routes.MAX_LIST_LIMIT},
        "Page size",
    ),
    query(
        "order",
        {"type": "string", "enum": list(file_routes.LIST_ORDERS), "default": "desc"},
        "By creation time: desc, newest first, or asc",
    ),
    query("after", {"type": "string"}, "A file id: list the files after it in this order"),
    query("purpose", {"type": "string"}, "Only files of this purpose (batch, batch_output)"),
)
GENERATION_ERRORS = (404, 413, 429, 504)  # 404: no such served model
REQUEST_LINKS = ("requests.retrieve_request", "requests.request_events", "requests.cancel_request")
FILE_LINKS = ("files.retrieve_file", "files.file_content", "files.delete_file")
BATCH_LINKS = ("batches.retrieve_batch", "batches.cancel_batch", "batches.batch_events")
RESPONSE_LINKS = ("responses.retrieve", "responses.list_input_items", "responses.cancel", "responses.delete")
CONVERSATION_LINKS = ("conversations.retrieve", "conversations.update", "conversations.list_items",
                      "conversations.create_items", "conversations.delete")  # fmt: skip


def chat_example(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def completion_example(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "Once upon a time", "max_tokens": 8}


def response_example(model: str) -> dict[str, Any]:
    return {"model": model, "input": "Say hello.", "max_output_tokens": 8}


def message_example(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def count_tokens_example(model: str) -> dict[str, Any]:
    return {"model": model, "system": "Be brief.", "messages": [{"role": "user", "content": "Say hello."}]}


def conversation_example(model: str) -> dict[str, Any]:
    return {"items": [{"type": "message", "role": "user", "content": "Say hello."}], "metadata": {"topic": "demo"}}


def embedding_example(model: str) -> dict[str, Any]:
    return {"model": model, "input": ["Once upon a time", "The end"], "encoding_format": "float"}


def tokenize_example(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "Once upon a time", "return_token_strs": True}


def batch_example(model: str) -> dict[str, Any]:
    return {"input_file_id": "file-abc123", "endpoint": "/v1/chat/completions", "completion_window": "24h"}


OPERATIONS: dict[str, Operation] = {
    "chat.create_chat_completion": Operation(
        "Create a chat completion", "chat", gen.ChatCompletion, ChatCompletionRequest,
        stream=(gen.ChatCompletionChunk, gen.ErrorResponse), errors=GENERATION_ERRORS, example=chat_example,
        links=REQUEST_LINKS,
    ),
    "completions.create_completion": Operation(
        "Create a completion", "completions", gen.TextCompletion, CompletionRequest,
        stream=(gen.TextCompletionChunk, gen.ErrorResponse), errors=GENERATION_ERRORS, example=completion_example,
        links=REQUEST_LINKS,
    ),
    "embeddings.create_embedding": Operation(
        "Create embeddings", "embeddings", emb.EmbeddingList, EmbeddingRequest, errors=(*GENERATION_ERRORS, 409),
        example=embedding_example,
    ),
    "responses.create": Operation(
        "Create a response", "responses", resp.ResponseObject, ResponseCreateRequest, stream=resp.RESPONSE_EVENTS,
        is_done_terminated=False, errors=GENERATION_ERRORS, example=response_example, links=RESPONSE_LINKS,
    ),
    "responses.retrieve": Operation(
        "Retrieve a response, or replay and follow its events", "responses", resp.ResponseObject,
        stream=resp.RESPONSE_EVENTS, is_done_terminated=False, parameters=RESPONSE_STREAM, errors=(404, 410),
    ),
    "responses.list_input_items": Operation(
        "List a response's input items", "responses", resp.InputItemList, errors=(404,),
        parameters=(
            query("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}, "Page size"),
            query("order", {"type": "string", "enum": ["asc", "desc"], "default": "desc"}, "desc: newest first"),
            query("after", {"type": "string"}, "An item id: list the items after it in this order"),
        ),
    ),
    "responses.cancel": Operation("Cancel a background response", "responses", resp.ResponseObject, errors=(404,)),
    "responses.delete": Operation("Delete a response", "responses", resp.ResponseDeleted, errors=(404,)),
    "conversations.create": Operation("Create a conversation", "conversations", conv.Conversation,
                                      ConversationCreateRequest, example=conversation_example,
                                      links=CONVERSATION_LINKS),
    "conversations.retrieve": Operation("Retrieve a conversation", "conversations", conv.Conversation, errors=(404,)),
    "conversations.update": Operation("Update a conversation's metadata", "conversations", conv.Conversation,
                                      ConversationUpdateRequest, errors=(404, 413)),
    "conversations.delete": Operation("Delete a conversation and its items", "conversations",
                                      conv.ConversationDeleted, errors=(404,)),
    "conversations.list_items": Operation("List a conversation's items", "conversations", conv.ConversationItemList,
                                          parameters=conv.ITEM_LIST_PARAMETERS, errors=(404,)),
    "conversations.create_items": Operation("Add items to a conversation", "conversations",
                                            conv.ConversationItemList, ItemsCreateRequest,
                                            parameters=(conv.ITEM_INCLUDE,), errors=(404, 413)),
    "conversations.retrieve_item": Operation("Retrieve a conversation's item", "conversations",
                                             conv.ConversationItem, parameters=(conv.ITEM_INCLUDE,), errors=(404,)),
    "conversations.delete_conversation_item": Operation("Delete an item; answers the conversation", "conversations",
                                                        conv.Conversation, errors=(404,)),
    "messages.create": Operation(
        "Create a message (Anthropic's Messages API)", "messages", msg.Message, MessageCreateRequest,
        stream=msg.MESSAGE_EVENTS, is_done_terminated=False, errors=GENERATION_ERRORS, example=message_example,
        error=msg.AnthropicErrorResponse,
    ),
    "messages.count_tokens": Operation(
        "Count a message's input tokens (Anthropic's)", "messages", msg.MessageTokenCount, MessageCountTokensRequest,
        errors=(404, 413), example=count_tokens_example, error=msg.AnthropicErrorResponse,
    ),
    "tokenize.tokenize": Operation("Tokenize a prompt or chat messages (vLLM's)", "tokenize", srv.Tokenized,
                                   srv.TokenizeRequest, errors=(404, 413), example=tokenize_example),
    "tokenize.detokenize": Operation("Detokenize token ids (vLLM's)", "tokenize", srv.Detokenized, Detokenize,
                                     errors=(404, 413)),
    "models.list_models": Operation("List the served model", "models", res.ModelList),
    "models.retrieve_model": Operation("Retrieve a model", "models", res.Model, errors=(404,)),
    "requests.retrieve_request": Operation("Retrieve a request, with its result", "requests", gen.RequestObject,
                                           errors=(404,)),
    "requests.request_events": Operation(
        "Replay and follow a request's event stream", "requests",
        stream=(gen.ChatCompletionChunk, gen.TextCompletionChunk, gen.ErrorResponse), parameters=LAST_EVENT_ID,
        errors=(404, 410),
    ),
    "requests.cancel_request": Operation("Cancel a request", "requests", gen.RequestObject, errors=(404,)),
    "files.create_file": Operation("Upload a batch input file", "files", res.FileObject, form=res.FileUpload,
                                   parameters=(IDEMPOTENCY_KEY,), errors=(409, 413), links=FILE_LINKS),
    "files.list_files": Operation("List files, newest first by default", "files", res.FileList, parameters=FILE_LIST,
                                  errors=(404,)),
    "files.retrieve_file": Operation("Retrieve a file", "files", res.FileObject, errors=(404,)),
    "files.file_content": Operation("Retrieve a file's content", "files", content_type="application/octet-stream",
                                    errors=(404,)),
    "files.delete_file": Operation("Delete a file", "files", res.FileDeleted, errors=(404,)),
    "batches.create_batch": Operation("Create a batch", "batches", res.Batch, BatchCreate,
                                      parameters=(IDEMPOTENCY_KEY,), errors=(404, 409, 413), example=batch_example,
                                      links=BATCH_LINKS),
    "batches.list_batches": Operation(
        "List batches, newest first", "batches", res.BatchList,
        parameters=(
            query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": DEFAULT_LIST_LIMIT},
                  "Page size"),
            query("after", {"type": "string"}, "A batch id: list the batches older than it"),
        ),
    ),
    "batches.retrieve_batch": Operation("Retrieve a batch", "batches", res.Batch, errors=(404,)),
    "batches.cancel_batch": Operation("Cancel a batch", "batches", res.Batch, errors=(404,)),
    "batches.batch_events": Operation("Follow a batch's progress events", "batches", parameters=LAST_EVENT_ID,
                                      stream=(res.BatchEvent, gen.ErrorResponse), errors=(404,)),
    "saes.list_saes": Operation("List the SAEs the workers steer and monitor with", "steering", res.SaeList),
    "steering.get_profile": Operation("Read a steering profile", "steering", res.SteeringProfileObject,
                                      parameters=(PROFILE_SCOPE,)),
    "steering.put_profile": Operation("Set a steering profile", "steering", res.SteeringProfileObject, SteeringBody,
                                      parameters=(PROFILE_SCOPE,), errors=(403, 413)),
    "steering.delete_profile": Operation("Clear a steering profile", "steering", res.SteeringProfileObject,
                                         parameters=(PROFILE_SCOPE,), errors=(403,)),
    "steering.get_monitor": Operation("Read the worker-wide monitor", "steering", res.Monitor),
    "steering.put_monitor": Operation("Set the worker-wide monitor (admin)", "steering", res.Monitor,
                                      WorkerMonitorBody, errors=(403, 413)),
    "steering.delete_monitor": Operation("Stop the worker-wide monitor (admin)", "steering", res.Monitor,
                                         errors=(403,)),
    "health.health": Operation("Liveness of Redis and the database", "health", srv.Health),
    "health.ready": Operation("Readiness: a live worker for every served model", "health", srv.Readiness,
                              unavailable=srv.NotReady),
    "metrics.metrics": Operation("Prometheus metrics of the api and every live worker (admin)", "health",
                                 content_type=CONTENT_TYPE_LATEST, errors=(403,)),
    "version.server_version": Operation("The server's version", "health", srv.Version),
}  # fmt: skip
