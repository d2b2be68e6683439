"""Anthropic's stream events (message_start, content_block_start / _delta / _stop, message_delta, message_stop, ping,
error), made from a request's stream events (tasks/messages/generation.py StreamEvent), the same ones chat's
stream relays: text becomes a text block's text_delta events, each tool call the worker sends (its id and name,
then its arguments) a tool_use block with one input_json_delta."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.messages.objects import message_shell, split_stop_sequence, stop_reason, stream_error, usage_object
from tasks.messages.generation import ErrorInfo, EventType, StreamEvent, Usage
from tasks.store.models import RequestRecord

PING = {"type": "ping"}


@dataclass
class MessageEvents:
    """One stream's translator; `stop_sequences` are the request's (its text arrives ending with the one that
    stopped it, api/messages/conversion.py)."""

    record: RequestRecord
    stop_sequences: list[str]
    num_blocks: int = 0  # content blocks opened so far
    open_block: str | None = None  # the open block's type
    has_tool_use: bool = False
    stop_sequence: str | None = None

    def opening(self) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": message_shell(self.record)}, PING]

    def translate(self, event: StreamEvent) -> list[dict[str, Any]]:
        if event.type == EventType.START:
            return []
        if event.type == EventType.FINAL:
            return self._finish(event)
        text = event.text
        if self.stop_sequences:
            text, stop_sequence = split_stop_sequence(text, self.stop_sequences)
            self.stop_sequence = stop_sequence or self.stop_sequence
        events = self._text_events(text) if text else []
        for entry in event.tool_calls:
            events.extend(self._call_events(entry))
        return events

    def error(self, info: ErrorInfo) -> list[dict[str, Any]]:
        return [stream_error(info)]

    def _text_events(self, text: str) -> list[dict[str, Any]]:
        events = [] if self.open_block == "text" else self._open({"type": "text", "text": ""})
        events.append(self._delta({"type": "text_delta", "text": text}))
        return events

    def _call_events(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """The worker sends each call as two entries: its id and name, then its arguments (as far as they got, for
        a call max_tokens cut)."""
        function = entry.get("function") or {}
        if "id" in entry:
            self.has_tool_use = True
            return self._open({"type": "tool_use", "id": entry["id"], "name": function["name"], "input": {}})
        return [self._delta({"type": "input_json_delta", "partial_json": function.get("arguments", "")})]

    def _open(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.open_block = block["type"]
        self.num_blocks += 1
        return [*events, {"type": "content_block_start", "index": self.num_blocks - 1, "content_block": block}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.num_blocks - 1, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if self.open_block is None:
            return []
        self.open_block = None
        return [{"type": "content_block_stop", "index": self.num_blocks - 1}]

    def _finish(self, event: StreamEvent) -> list[dict[str, Any]]:
        if event.error is not None:
            return [stream_error(event.error)]
        finish_reason = event.finish_reason.value if event.finish_reason else None
        usage = event.usage or Usage(self.record.prompt_tokens, 0)
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(finish_reason, self.has_tool_use, self.stop_sequence),
                "stop_sequence": self.stop_sequence,
            },
            "usage": usage_object(usage.prompt_tokens, usage.completion_tokens, usage.details.cached_tokens),
        }
        reports = {"steering": event.steering, "monitor": event.monitor}
        delta.update({name: report for name, report in reports.items() if report is not None})
        return [*self._close(), delta, {"type": "message_stop"}]
