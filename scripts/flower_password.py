"""Flower's login for `make serve`: FLOWER_BASIC_AUTH when it is set, else `admin` and a password generated on the
first run into var/flower_password (mode 0600) and shown that once. Flower can revoke tasks and read their
arguments, so there is no default password."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from tasks.config import REPO_ROOT, Config

PASSWORD_FILE = REPO_ROOT / "var" / "flower_password"
FLOWER_USER = "admin"


def flower_basic_auth(config: Config, path: Path = PASSWORD_FILE) -> str:
    """Flower's `user:password`."""
    if config.flower_basic_auth:
        return config.flower_basic_auth
    if path.exists():
        return f"{FLOWER_USER}:{path.read_text().strip()}"
    password = secrets.token_urlsafe(24)  # no ':' or ',', which Flower's option would split on
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(password + "\n")
    # stdout, not the log: a secret shown once to whoever started the stack, not kept in log files
    sys.stdout.write(f"Flower login: {FLOWER_USER} / {password} (shown once; kept in {path})\n")
    sys.stdout.flush()
    return f"{FLOWER_USER}:{password}"
