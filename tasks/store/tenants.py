"""Tenants: the owners of requests, files and batches. A tenant is only a name; each API key says whose it is."""

from __future__ import annotations

import re

# Rows made before tenancy existed, the static API_KEY, and open mode (no key at all, loopback only) belong here.
DEFAULT_TENANT = "default"
# Tenant names end up in Redis keys and log lines: keep them to a plain, bounded alphabet.
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_tenant_name(name: str) -> str:
    if not TENANT_NAME.match(name):
        message = f"tenant {name!r} must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        raise ValueError(message)
    return name
