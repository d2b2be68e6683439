"""API keys in SQL: a name, a tenant, a scope, and a SHA-256 digest of the key; never the key itself.

A key is `sb-` and 32 random bytes from `secrets`. A fast hash is the right one here: slow hashes (bcrypt, scrypt)
protect low-entropy passwords from guessing, and there is nothing to guess in 256 random bits. Lookups are by
digest; nothing is cached, so a revoked key is refused from the next request on.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from enum import Enum

from sqlalchemy import Boolean, Float, Integer, String, delete, exists, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from tasks.store.models import Base
from tasks.store.tenants import DEFAULT_TENANT, check_tenant_name

KEY_PREFIX = "sb-"
KEY_BYTES = 32
TOUCH_EVERY_S = 60.0  # last_used_at is written at most this often per key and api process, not on every request


class Scope(str, Enum):
    USER = "user"  # its tenant's requests, files, batches and steering profile
    ADMIN = "admin"  # also what every tenant gets: the worker-wide steering profile and monitor


class ApiKeyRecord(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)  # what logs and the CLI show
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # SHA-256 hex of the key
    tenant: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)  # unix seconds
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(session: Session, name: str, tenant: str = DEFAULT_TENANT, scope: Scope = Scope.USER) -> str:
    """A new key named `name`, committed; the only time the key exists outside its holder's hands."""
    if not name or len(name) > 128:
        raise ValueError("a key's name is 1 to 128 characters")
    key = KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)
    record = ApiKeyRecord(
        name=name,
        key_hash=key_digest(key),
        tenant=check_tenant_name(tenant),
        scope=scope.value,
        created_at=time.time(),
        revoked=False,
    )
    session.add(record)
    session.commit()
    return key


def replace_key(session: Session, name: str, tenant: str = DEFAULT_TENANT, scope: Scope = Scope.USER) -> str:
    """A new key under `name`, deleting any earlier one of that name: launchers that make their own key per run."""
    session.execute(delete(ApiKeyRecord).where(ApiKeyRecord.name == name))
    return create_key(session, name, tenant, scope)


def find_key(session: Session, key: str) -> ApiKeyRecord | None:
    """The unrevoked key `key` is, or None. The index lookup is by digest, so its timing says nothing about the key;
    the constant-time comparison after it is the check that counts."""
    digest = key_digest(key)
    record = session.scalar(select(ApiKeyRecord).where(ApiKeyRecord.key_hash == digest))
    if record is None or record.revoked or not hmac.compare_digest(record.key_hash, digest):
        return None
    return record


def touch_key(session: Session, record: ApiKeyRecord) -> None:
    """Record a use, unless one was recorded in the last TOUCH_EVERY_S: a write per request would contend with the
    workers' writes (SQLite has one writer at a time)."""
    now = time.time()
    if record.last_used_at is not None and now - record.last_used_at < TOUCH_EVERY_S:
        return
    session.execute(update(ApiKeyRecord).where(ApiKeyRecord.id == record.id).values(last_used_at=now))
    session.commit()


def has_active_keys(session: Session) -> bool:
    return bool(session.scalar(select(exists().where(ApiKeyRecord.revoked.is_(False)))))


def list_keys(session: Session) -> list[ApiKeyRecord]:
    return list(session.scalars(select(ApiKeyRecord).order_by(ApiKeyRecord.created_at)))


def revoke_key(session: Session, name: str) -> bool:
    """True if an unrevoked key of that name was revoked now."""
    revoked = session.execute(
        update(ApiKeyRecord).where(ApiKeyRecord.name == name, ApiKeyRecord.revoked.is_(False)).values(revoked=True)
    )
    session.commit()
    return revoked.rowcount == 1
