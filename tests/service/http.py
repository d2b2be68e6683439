"""Headers for requests to a running stack: every /v1 route needs a key, and its tenant decides what is visible."""

from __future__ import annotations

from scripts.stack import Stack


def bearer(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def auth(stack: Stack) -> dict[str, str]:
    """The stack's own admin key (tenant "default")."""
    assert stack.api_key is not None, "the stack was started without a key"
    return bearer(stack.api_key)
