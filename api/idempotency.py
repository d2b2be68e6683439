"""The Idempotency-Key header: the same key and body give back the same object; the same key with another body
is refused with 409."""

from __future__ import annotations

import hashlib
from typing import Protocol

from flask import request

from api.errors import APIError

MAX_KEY_LENGTH = 256


class Idempotent(Protocol):
    request_hash: str | None


def idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 0 < len(key) <= MAX_KEY_LENGTH:
        raise APIError(400, f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters", param="Idempotency-Key")
    return key


def request_hash(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())  # hash of hashes: no two part lists collide by concatenation
    return digest.hexdigest()


def check_replay(record: Idempotent, digest: str) -> None:
    """Raise 409 unless `record`, made earlier with the same key, came from this same request."""
    if record.request_hash != digest:
        raise APIError(
            409,
            "This Idempotency-Key was already used with a different request.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
