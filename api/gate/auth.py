"""Every route but the health probes, /openapi.json and /docs needs `Authorization: Bearer <key>` (or `x-api-key:
<key>`, as Anthropic's clients send it). The key's tenant owns what a request creates and is all it can see; its scope
says whether it may change what every tenant gets (the worker-wide steering profile and monitor). No key is ever
logged: its name is.

Open mode: while no key exists at all (no API_KEY, no unrevoked key in SQL), an api bound to loopback serves its own
machine's clients as tenant "default" with admin scope. api/gate/exposure.py refuses to start on any other address."""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import NoReturn

from flask import g, request

from api.errors import APIError
from api.gate.exposure import is_loopback
from api.gate.trusted_keys import TrustedKeys
from api.services import db_session, services
from tasks.store.api_keys import Scope, find_key, has_active_keys, key_digest, touch_key
from tasks.store.tenants import DEFAULT_TENANT

logger = logging.getLogger(__name__)
# the probes (api/status/health_routes.py), and the API's contract: /openapi.json and its Swagger UI at /docs
# (api/openapi/), as vLLM serves them
OPEN_ENDPOINTS = frozenset({"health.health", "health.ready", "openapi.document", "swagger_ui.show"})
STATIC_KEY_NAME = "API_KEY"  # how logs name the key from the environment


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant whose objects it sees, its scope, and its key's name for the logs."""

    tenant: str
    scope: Scope
    key_name: str

    @property
    def is_admin(self) -> bool:
        return self.scope == Scope.ADMIN


OPEN_PRINCIPAL = Principal(DEFAULT_TENANT, Scope.ADMIN, "(open mode)")


def authenticate() -> None:
    """Flask's before_request hook: sets g.principal, or answers 401 in OpenAI's shape."""
    if request.endpoint in OPEN_ENDPOINTS:
        return
    key = _bearer_key()
    principal = None if key is None else _principal_for(key)
    if principal is None and _is_open():
        principal = OPEN_PRINCIPAL
    if principal is None:
        _refuse(key)
    g.principal = principal


def current_principal() -> Principal:
    return g.principal


def require_admin(what: str, why: str = "it changes what every tenant gets") -> None:
    """403 unless the caller's key has admin scope; `what` names the action and `why` the reason, for the message."""
    if not current_principal().is_admin:
        message = f"Only an admin key may {what}: {why}."
        raise APIError(403, message, code="insufficient_permissions")


def _refuse(key: str | None) -> NoReturn:
    reason = "no key" if key is None else "an unknown or revoked key"  # the key itself is never logged
    logger.info("401 for %s %s from %s: %s", request.method, request.path, request.remote_addr, reason)
    message = (
        "You didn't provide an API key. Send it as `Authorization: Bearer <key>`."
        if key is None
        else "Incorrect API key provided."
    )
    raise APIError(401, message, code="invalid_api_key")


def _bearer_key() -> str | None:
    """`Authorization: Bearer <key>`, or else Anthropic's `x-api-key: <key>` (what its SDKs send)."""
    scheme, _, key = request.headers.get("Authorization", "").strip().partition(" ")
    key = key.strip()
    if scheme.lower() == "bearer" and key:
        return key
    return request.headers.get("x-api-key", "").strip() or None


def _principal_for(key: str) -> Principal | None:
    static_key = services().config.api_key
    # Digests in constant time: neither the time taken nor the length compared depends on what the caller sent.
    if static_key and hmac.compare_digest(key_digest(static_key), key_digest(key)):
        return Principal(DEFAULT_TENANT, Scope.ADMIN, STATIC_KEY_NAME)
    # a key looked up lately is trusted for a second (api/gate/trusted_keys.py): the bound on a revocation's delay
    trusted: TrustedKeys[Principal] = services().trusted_keys
    digest = key_digest(key)
    principal = trusted.get(digest)
    if principal is not None:
        return principal
    session = db_session()
    record = find_key(session, key)
    if record is None:
        return None
    touch_key(session, record)
    session.commit()  # ends the lookup's transaction: its pooled connection goes back before the view runs
    principal = Principal(record.tenant, Scope(record.scope), record.name)
    trusted.trust(digest, principal)
    return principal


def _is_open() -> bool:
    """No key exists, and both the api's address and this client's are loopback (the second guards against a
    launcher that binds wider than HOST says, since only gunicorn's hook sees the real address)."""
    if services().config.api_key or not is_loopback(services().config.host):
        return False
    return is_loopback(request.remote_addr) and not has_active_keys(db_session())
