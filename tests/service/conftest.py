"""Keys of two user tenants, and a revoked one, in the running stack's database."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from scripts.stack import Stack
from tasks.config import REPO_ROOT
from tasks.store.api_keys import Scope, replace_key
from tasks.store.db import make_db_engine, make_session_factory


@dataclass(frozen=True)
class TenantKeys:
    a: str  # user key of tenant "a"
    b: str  # user key of tenant "b"
    revoked: str  # was tenant "a"'s, revoked through the CLI


@pytest.fixture(scope="session")
def tenant_keys(stack: Stack) -> TenantKeys:
    engine = make_db_engine(stack.config.database_url)
    with make_session_factory(engine)() as session:
        keys = {name: replace_key(session, name, tenant, Scope.USER) for name, tenant in
                (("tenant-a", "a"), ("tenant-b", "b"), ("revoked-a", "a"))}  # fmt: skip
    engine.dispose()
    env = {**os.environ, **stack.config.to_env()}
    command = [sys.executable, "-m", "scripts.cli.api_keys", "revoke", "revoked-a"]
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=60)
    return TenantKeys(a=keys["tenant-a"], b=keys["tenant-b"], revoked=keys["revoked-a"])
