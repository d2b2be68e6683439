"""The Idempotency-Key header: the same key and body give back the same object; the same key with another body
is refused with 409."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol, TypeVar

from flask import request
from sqlalchemy.exc import IntegrityError

from api.errors import APIError
from api.services import db_session

MAX_KEY_LENGTH = 256


class Idempotent(Protocol):
    request_hash: str | None


Record = TypeVar("Record", bound=Idempotent)


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


def commit_once(record: Record, key: str | None, digest: str, find_by_key: Callable[[str], Record | None]) -> Record:
    """Commits the new `record`; when a concurrent request with the same key committed first (the unique key
    refuses this one), returns that earlier record instead, or 409 if it came from another request."""
    session = db_session()
    session.add(record)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        earlier = find_by_key(key) if key is not None else None
        if earlier is None:
            raise
        check_replay(earlier, digest)
        return earlier
    return record
