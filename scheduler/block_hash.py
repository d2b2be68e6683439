"""The chained hash of a full KV block: what the block holds, and everything before it."""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockKey:
    parent_hash: bytes | None  # the previous block's hash; None for a request's first block
    token_ids: tuple[int, ...]
    steering_key: str  # K/V computed under different steering differ, so they never match


def block_hash(key: BlockKey) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(key.parent_hash or b"")
    digest.update(array("q", key.token_ids).tobytes())
    digest.update(key.steering_key.encode())
    return digest.digest()
