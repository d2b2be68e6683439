"""OpenAI's expiration policy for files: `expires_after` on an upload, `output_expires_after` on a batch."""

from __future__ import annotations

import re
from typing import Literal

from werkzeug.datastructures import MultiDict

from api.errors import APIError
from api.structured.schemas import StrictModel
from tasks.config import Config

MAX_EXPIRY_S = 30 * 24 * 3600  # OpenAI's bounds: an hour (Config.file_expiry_min_s) to 30 days


class ExpiresAfter(StrictModel):
    anchor: Literal["created_at"]
    seconds: int


def checked_expiry_s(expires_after: ExpiresAfter | None, config: Config, param: str) -> int | None:
    """Seconds after creation the file expires; None: it is kept until deleted."""
    if expires_after is None:
        return None
    if not config.file_expiry_min_s <= expires_after.seconds <= MAX_EXPIRY_S:
        message = f"{param}.seconds must lie in [{config.file_expiry_min_s}, {MAX_EXPIRY_S}]"
        raise APIError(400, message, param=f"{param}.seconds")
    return expires_after.seconds


def form_expires_after(form: MultiDict[str, str]) -> ExpiresAfter | None:
    """`expires_after` as a multipart form spells it (`expires_after[anchor]`, `expires_after[seconds]`)."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if seconds is None or not re.fullmatch(r"[0-9]{1,10}", seconds):
        raise APIError(400, "expires_after.seconds must be a whole number of seconds", param="expires_after.seconds")
    if anchor != "created_at":
        raise APIError(400, "expires_after.anchor must be 'created_at'", param="expires_after.anchor")
    return ExpiresAfter(anchor="created_at", seconds=int(seconds))
