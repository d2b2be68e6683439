"""A request that runs as a chat request (the Responses and Messages APIs) is refused naming the caller's own fields:
a 400 the chat path raises about `messages`, `max_completion_tokens` or `tools.0.function.parameters` names what the
caller sent instead."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError

from api.errors import APIError, validation_error_info

# (a pattern of chat's field path, what the caller's field is called), the first match wins
Renames = tuple[tuple[re.Pattern[str], str], ...]


@contextmanager
def callers_params(renames: Renames) -> Iterator[None]:
    """Inside it, an APIError (or a chat body's ValidationError) with a `param` names the caller's field."""
    try:
        yield
    except ValidationError as exc:
        info = validation_error_info(exc)
        error = APIError(400, info.message, type=info.type, param=info.param, code=info.code)
        raise _renamed(error, renames) from exc
    except APIError as exc:
        if exc.info.param is None:
            raise
        raise _renamed(exc, renames) from exc


def _renamed(exc: APIError, renames: Renames) -> APIError:
    param = exc.info.param
    if param is None:
        return exc
    renamed = next((pattern.sub(name, param, count=1) for pattern, name in renames if pattern.match(param)), param)
    info = exc.info
    message = str(exc).replace(param, renamed)
    return APIError(exc.status, message, type=info.type, param=renamed, code=info.code, headers=exc.headers)
