"""Reading a request's tokens across prompt, output and proposed tokens."""

from __future__ import annotations

import pytest

from scheduler.request import Request


def test_token_at_reads_what_token_ids_joins() -> None:
    request = Request("r", [10, 11, 12], max_tokens=8, output_token_ids=[13, 14], spec_token_ids=[15])
    assert [request.token_at(position) for position in range(6)] == request.token_ids(0, 6) == [10, 11, 12, 13, 14, 15]
    with pytest.raises(IndexError):
        request.token_at(6)
