"""The principals of keys found in SQL lately, per api process, so that a client's every request does not look its key
up again: each lookup was a SELECT and a commit in line before the request's first token (about 0.7 ms of the api's
4.3 ms of CPU for a streamed completion, with the pool's connection and transaction around it).

The bound: a key's principal is trusted for KEY_TRUSTED_FOR_S after its lookup. A key revoked in SQL (by the CLI or
any other process) is refused by every api process within that time of the revocation; an unknown or revoked key is
never remembered, so a new key works at once and a refused one is looked up again on every request."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

KEY_TRUSTED_FOR_S = 1.0
# More distinct keys than this within KEY_TRUSTED_FOR_S start the table over rather than grow it without end.
MAX_TRUSTED_KEYS = 4096

Principal = TypeVar("Principal")


@dataclass
class TrustedKeys(Generic[Principal]):
    """Key digest -> (principal, the monotonic time its trust ends). A digest, never the key: the table is looked up by
    what an index lookup in SQL would use, so its timing says nothing about keys either."""

    trusted_for_s: float = KEY_TRUSTED_FOR_S
    _by_digest: dict[str, tuple[Principal, float]] = field(default_factory=dict)

    def get(self, digest: str) -> Principal | None:
        entry = self._by_digest.get(digest)
        if entry is None:
            return None
        principal, trusted_until = entry
        if time.monotonic() >= trusted_until:
            self._by_digest.pop(digest, None)
            return None
        return principal

    def trust(self, digest: str, principal: Principal) -> None:
        if len(self._by_digest) >= MAX_TRUSTED_KEYS:
            self._by_digest.clear()
        self._by_digest[digest] = (principal, time.monotonic() + self.trusted_for_s)
