"""A minimal SSE reader over `requests`, for tests that need ids and comments, not just data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import requests


@dataclass(frozen=True)
class Frame:
    event_id: str | None
    data: str | None  # None for a comment line such as a heartbeat

    @property
    def json(self) -> dict:
        assert self.data is not None and self.data != "[DONE]"
        return json.loads(self.data)


def read_frames(response: requests.Response) -> Iterator[Frame]:
    event_id: str | None = None
    data: str | None = None
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith(":"):
            yield Frame(None, None)
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and data is not None:
            yield Frame(event_id, data)
            event_id, data = None, None


def data_frames(frames: list[Frame]) -> list[Frame]:
    return [frame for frame in frames if frame.data is not None]
