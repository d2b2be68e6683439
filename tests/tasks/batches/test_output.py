"""A batch line that ran and failed carries the status its error would have had as a request of its own: a request
the worker refused (an unreadable steering vector file, a grammar only it rejects) is a 400, its own failure a 500."""

from __future__ import annotations

import pytest

from tasks.batches.models import BatchLine, LineStatus
from tasks.batches.output import error_line


@pytest.mark.parametrize(("error_type", "status_code"), [("invalid_request_error", 400), ("server_error", 500)])
def test_a_failed_line_has_its_error_s_status(error_type: str, status_code: int) -> None:
    error = {"message": "steering or monitor: no such file", "type": error_type, "param": None, "code": None}
    line = BatchLine(
        id="line-1", custom_id="a", request_id="chatcmpl-1", status=LineStatus.FAILED.value, request={}, error=error
    )
    row = error_line(line)
    assert row["response"]["status_code"] == status_code and row["response"]["body"] == {"error": error}
