"""The Responses API's typed stream events, made from a request's stream events (tasks/messages/generation.py
StreamEvent).

The events and their `sequence_number`s depend only on the request's stream, read from its start: a client that
resumes after sequence number N is sent the same events a full read sends after N."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks.messages.generation import ErrorInfo, EventType, FinishReason, StreamEvent
from tasks.messages.response_objects import function_call_item, message_item, response_object, text_part
from tasks.store.response_models import ResponseRecord

TERMINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "cancelled": "response.incomplete",  # OpenAI has no cancelled event; the response's status says it
    "failed": "response.failed",
}


@dataclass
class ResponseEvents:
    """One stream's translator. `load` reads the stored response again (the worker records the result in SQL before
    its final stream event, so at that event the stored response is the final one)."""

    record: ResponseRecord
    tool_parser: str
    load: Callable[[], ResponseRecord]
    sequence_number: int = 0
    num_items: int = 0  # output items opened so far
    open_text: str | None = None  # the open message item's text; None: no message item is open
    open_logprobs: list[dict[str, Any]] = field(default_factory=list)  # the open text's, when the request asked
    open_calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by the worker's call index: opened items

    def opening(self) -> list[dict[str, Any]]:
        status = "queued" if self.record.background else "in_progress"
        return [self._lifecycle("response.created", response_object(self.record, self.tool_parser, status))]

    def translate(self, event: StreamEvent) -> list[dict[str, Any]]:
        if event.type == EventType.START:
            snapshot = response_object(self.record, self.tool_parser, "in_progress")
            return [self._lifecycle("response.in_progress", snapshot)]
        if event.type == EventType.FINAL:
            return self._finish(event)
        # a stop token's logprob arrives without text, and belongs to the text's logprobs as chat's do
        events = self._text_events(event.text, event.logprobs) if event.text or event.logprobs else []
        for entry in event.tool_calls:
            events.extend(self._call_events(entry))
        return events

    def error(self, info: ErrorInfo) -> list[dict[str, Any]]:
        """A stream that cannot go on (timed out, Redis gone): OpenAI's `error` event."""
        return [
            self._numbered({"type": "error", "code": info.code or info.type, "message": info.message, "param": None})
        ]

    def _text_events(self, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = []
        if self.open_text is None:
            events += self._open_message()
        self.open_text = (self.open_text or "") + text
        self.open_logprobs += logprobs
        delta = {"type": "response.output_text.delta", **self._text_place(), "delta": text, "logprobs": logprobs}
        events.append(self._numbered(delta))
        return events

    def _open_message(self) -> list[dict[str, Any]]:
        index = self.num_items
        self.num_items += 1
        item = message_item(self.record, index, None, "in_progress")
        self.open_text, self.open_logprobs = "", []
        return [
            self._numbered({"type": "response.output_item.added", "output_index": index, "item": item}),
            self._numbered({"type": "response.content_part.added", **self._text_place(), "part": text_part("")}),
        ]

    def _close_message(self, status: str) -> list[dict[str, Any]]:
        if self.open_text is None:
            return []
        text, logprobs, place = self.open_text, self.open_logprobs, self._text_place()
        self.open_text = None
        item = message_item(self.record, place["output_index"], text, status, logprobs)
        return [
            self._numbered({"type": "response.output_text.done", **place, "text": text, "logprobs": logprobs}),
            self._numbered({"type": "response.content_part.done", **place, "part": text_part(text, logprobs)}),
            self._numbered({"type": "response.output_item.done", "output_index": place["output_index"], "item": item}),
        ]

    def _call_events(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """The worker sends each whole call as two entries: its id and name, then its arguments."""
        function = entry.get("function") or {}
        if "id" in entry:
            events = self._close_message("completed")
            index = self.num_items
            self.num_items += 1
            item = function_call_item(self.record, index, entry["id"], function["name"], "", "in_progress")
            self.open_calls[entry["index"]] = {"output_index": index, "item": item}
            return [
                *events,
                self._numbered({"type": "response.output_item.added", "output_index": index, "item": item}),
            ]
        opened = self.open_calls.pop(entry["index"])
        arguments = function.get("arguments", "")
        place = {"item_id": opened["item"]["id"], "output_index": opened["output_index"]}
        done = {**opened["item"], "arguments": arguments, "status": "completed"}
        return [
            self._numbered({"type": "response.function_call_arguments.delta", **place, "delta": arguments}),
            self._numbered(
                {"type": "response.function_call_arguments.done", **place, "name": done["name"], "arguments": arguments}
            ),
            self._numbered({"type": "response.output_item.done", "output_index": opened["output_index"], "item": done}),
        ]

    def _finish(self, event: StreamEvent) -> list[dict[str, Any]]:
        is_cut_short = event.finish_reason in (FinishReason.LENGTH, FinishReason.ABORT) or event.error is not None
        events = self._close_message("incomplete" if is_cut_short else "completed")
        final = response_object(self.load(), self.tool_parser)
        return [*events, self._lifecycle(TERMINAL_EVENTS.get(final["status"], "response.failed"), final)]

    def _text_place(self) -> dict[str, Any]:
        index = self.num_items - 1
        return {"item_id": message_item(self.record, index, None, "")["id"], "output_index": index, "content_index": 0}

    def _lifecycle(self, event_type: str, response: dict[str, Any]) -> dict[str, Any]:
        return self._numbered({"type": event_type, "response": response})

    def _numbered(self, event: dict[str, Any]) -> dict[str, Any]:
        event["sequence_number"] = self.sequence_number
        self.sequence_number += 1
        return event
