"""Tool calls in a model's text, in the formats TOOL_CALL_PARSER names (vLLM's `--tool-call-parser` vocabulary):

- `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call, text around them;
- `llama3_json`: the whole reply is `{"name": ..., "parameters": {...}}`, several joined by `; `.

One `ToolCallStream` serves both the worker (fed as tokens arrive, so streamed deltas carry whole calls) and the
renderers of finished replies (fed the whole text at once), so a streamed reply assembles to what the non-streamed
one says. A hermes call ends at the first `</tool_call>` after which its body is one call object, so an argument
string may hold the end marker itself. Text that is not a well-formed call stays content, except a call cut off by
max_tokens, which is returned as a partial call (as OpenAI does). Stdlib only: the api renders with it too.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

HERMES = "hermes"
LLAMA3_JSON = "llama3_json"
PARSERS = (HERMES, LLAMA3_JSON)
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA3_PYTHON_TAG = "<|python_tag|>"
# The start of a call object cut short: its name (as far as it got) and the text after its arguments' key.
_PARTIAL_CALL = re.compile(
    r'^\s*\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"?(?:\s*,\s*"(?:arguments|parameters)"\s*:\s*(?P<arguments>.*))?',
    re.DOTALL,
)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON text, as OpenAI sends it

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def delta_entries(self, index: int) -> list[dict[str, Any]]:
        """OpenAI's streamed shape: the call's index, id and name first, then its arguments."""
        header = {"index": index, "id": self.id, "type": "function", "function": {"name": self.name, "arguments": ""}}
        return [header, {"index": index, "function": {"arguments": self.arguments}}]


@dataclass(frozen=True)
class ParsedReply:
    content: str | None  # None when the reply is only calls
    tool_calls: list[ToolCall]


def call_id(id_prefix: str, index: int) -> str:
    """Deterministic, so the stream and the stored reply of one choice name its calls alike."""
    return "call_" + hashlib.sha256(f"{id_prefix}:{index}".encode()).hexdigest()[:24]


def parse_call(text: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of one call object, or None when `text` is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)


def partial_call(text: str) -> tuple[str, str]:
    """(name, arguments as far as written) of a call object cut short; both empty before its name began."""
    found = _PARTIAL_CALL.match(text)
    if found is None:
        return "", ""
    try:
        name = json.loads(f'"{found["name"]}"')
    except ValueError:  # cut inside an escape
        name = found["name"]
    return name, (found["arguments"] or "").rstrip()


@dataclass
class ToolCallStream:
    """Text in, (content, complete calls) out. Content's trailing whitespace is held until more content follows,
    and dropped where a call begins or the reply ends with calls, so `\\n` between calls is not content."""

    parser: str
    id_prefix: str
    calls: list[ToolCall] = field(default_factory=list)
    _buffer: str = ""  # undecided text: a possible start of a call, or a call not yet closed
    _is_in_call: bool = False
    _pending_space: str = ""
    _decided_format: bool = False  # llama3_json: whether the reply's first character has been seen

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buffer += text
        num_calls = len(self.calls)
        content = self._advance_hermes() if self.parser == HERMES else self._advance_llama3()
        return content, self.calls[num_calls:]

    def flush(self, is_cut: bool = False) -> tuple[str, list[ToolCall]]:
        """The end of the reply: an unclosed call is content, or, when max_tokens cut the reply (`is_cut`), a
        partial call."""
        num_calls = len(self.calls)
        rest, self._buffer = self._buffer, ""
        if self.parser == LLAMA3_JSON and self._is_in_call:
            self._take_llama3_calls(rest, is_cut)
            rest = "" if len(self.calls) > num_calls else rest
        elif self._is_in_call and is_cut:
            self.calls.append(ToolCall(call_id(self.id_prefix, len(self.calls)), *partial_call(rest)))
            self._pending_space, rest = "", ""
        elif self._is_in_call:
            rest = HERMES_OPEN + rest
        content = self._content(rest)
        if not self.calls:
            content += self._pending_space
        self._pending_space = ""
        return content, self.calls[num_calls:]

    def _advance_hermes(self) -> str:
        content = ""
        while True:
            if not self._is_in_call:
                start = self._buffer.find(HERMES_OPEN)
                if start < 0:
                    keep = _partial_suffix(self._buffer, HERMES_OPEN)
                    content += self._content(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return content
                content += self._content(self._buffer[:start])
                self._buffer, self._is_in_call = self._buffer[start + len(HERMES_OPEN) :], True
                continue
            end = self._call_end()
            if end < 0:
                return content
            body, self._buffer = self._buffer[:end], self._buffer[end + len(HERMES_CLOSE) :]
            self._is_in_call = False
            self._add_call(body)

    def _call_end(self) -> int:
        """Where the open call's `</tool_call>` is: the first one that closes a whole call object (one inside an
        argument string does not); -1 while none does."""
        end = self._buffer.find(HERMES_CLOSE)
        while end >= 0:
            if parse_call(self._buffer[:end].strip()) is not None:
                return end
            end = self._buffer.find(HERMES_CLOSE, end + 1)
        return -1

    def _advance_llama3(self) -> str:
        """A reply that starts with `{` (or the python tag) is calls, decided at the end; any other is content."""
        if not self._decided_format:
            stripped = self._buffer.lstrip()
            if not stripped or LLAMA3_PYTHON_TAG.startswith(stripped):
                return ""
            self._decided_format = True
            self._is_in_call = stripped.startswith(("{", LLAMA3_PYTHON_TAG))
        if self._is_in_call:
            return ""
        text, self._buffer = self._buffer, ""
        return self._content(text)

    def _take_llama3_calls(self, text: str, is_cut: bool) -> None:
        """Every `; `-joined part must be a call; cut by max_tokens, the last may be a partial one."""
        parts = [part for part in text.strip().removeprefix(LLAMA3_PYTHON_TAG).split(";") if part.strip()]
        parsed = [parse_call(part.strip()) for part in parts]
        if parsed and is_cut and parsed[-1] is None:
            parsed[-1] = partial_call(parts[-1])
        if parsed and all(call is not None for call in parsed):
            for name, arguments in parsed:  # type: ignore[misc]
                self.calls.append(ToolCall(call_id(self.id_prefix, len(self.calls)), name, arguments))

    def _add_call(self, body: str) -> None:
        """`body` parses (`_call_end` found it so)."""
        parsed = parse_call(body.strip())
        assert parsed is not None
        self.calls.append(ToolCall(call_id(self.id_prefix, len(self.calls)), *parsed))
        self._pending_space = ""  # whitespace before a call is not content

    def _content(self, text: str) -> str:
        """`text` as content, less trailing whitespace, which waits for what follows."""
        if not text:
            return ""
        if not text.strip():
            self._pending_space += text
            return ""
        kept = text.rstrip()
        shown, self._pending_space = self._pending_space + kept, text[len(kept) :]
        return shown


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`: text that may yet become it."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def parse_reply(parser: str, text: str, id_prefix: str, is_cut: bool = False) -> ParsedReply:
    """A finished reply's content and calls, exactly as streaming it through `ToolCallStream` gives them; `is_cut`:
    max_tokens ended it."""
    stream = ToolCallStream(parser, id_prefix)
    content, _ = stream.feed(text)
    tail, _ = stream.flush(is_cut)
    content += tail
    return ParsedReply((content or None) if stream.calls else content, stream.calls)
