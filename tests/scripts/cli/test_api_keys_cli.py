"""The keys CLI as a user runs it: `create` prints the key and nothing else on stdout (so `$(...)` captures it),
`list` never shows a key, `revoke` makes the api refuse it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tasks.config import REPO_ROOT
from tasks.store.api_keys import find_key
from tasks.store.db import make_db_engine, make_session_factory


def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url}
    command = [sys.executable, "-m", "scripts.cli.api_keys", *args]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_create_list_and_revoke(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'fresh.db'}"  # not migrated yet: the CLI migrates first
    created = run_cli(database_url, "create", "--name", "me", "--tenant", "acme", "--admin")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert created.stdout == key + "\n" and key.startswith("sb-")
    assert "created key me (tenant acme, scope admin)" in created.stderr and key not in created.stderr

    again = run_cli(database_url, "create", "--name", "me")
    assert again.returncode == 1 and again.stdout == "" and "exists" in again.stderr

    listed = run_cli(database_url, "list")
    assert listed.returncode == 0 and key not in listed.stdout + listed.stderr
    [row] = listed.stdout.splitlines()[1:]
    assert row.split("\t")[:3] == ["me", "acme", "admin"] and row.endswith("\tactive")

    sessions = make_session_factory(make_db_engine(database_url))
    with sessions() as session:
        assert find_key(session, key) is not None
    assert run_cli(database_url, "revoke", "me").returncode == 0
    with sessions() as session:
        assert find_key(session, key) is None
    assert run_cli(database_url, "revoke", "me").returncode == 1
    assert run_cli(database_url, "list").stdout.splitlines()[1].endswith("\trevoked")
