"""A PostgreSQL database of one's own on the tests' server, for tests whose workers must not meet another stack's.

The session's `postgres_url` database is shared by every test that asks for it, including the running `stack`,
whose reaper dispatches any queued batch line it finds there."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy


@contextmanager
def own_database(server_url: str) -> Iterator[str]:
    """A fresh database on the server of `server_url` (any database URL there), dropped on exit."""
    url = sqlalchemy.engine.make_url(server_url)
    admin = sqlalchemy.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    name = f"steerbatch_test_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
