"""API keys and tenancy in SQL on SQLite and PostgreSQL: only digests are stored, revocation is at once, and the
migration gives rows made before tenancy to "default" and makes Idempotency-Keys unique per tenant."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import sqlalchemy
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy.orm import Session

from tasks.config import REPO_ROOT
from tasks.store.api_keys import (
    KEY_PREFIX,
    Scope,
    create_key,
    find_key,
    has_active_keys,
    list_keys,
    replace_key,
    revoke_key,
)
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tests.postgres import own_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with ExitStack() as cleanup:
        if request.param == "postgresql":
            yield cleanup.enter_context(own_database(request.getfixturevalue("postgres_url")))
        else:
            yield f"sqlite:///{tmp_path / 'keys.db'}"


@pytest.fixture
def session(database_url: str) -> Iterator[Session]:
    upgrade_to_head(database_url)
    engine = make_db_engine(database_url)
    with make_session_factory(engine)() as db:
        yield db
    engine.dispose()


def test_a_key_is_found_by_itself_until_revoked(session: Session) -> None:
    assert not has_active_keys(session)
    key = create_key(session, "ci", "acme", Scope.ADMIN)
    assert key.startswith(KEY_PREFIX) and len(key) >= len(KEY_PREFIX) + 43  # 32 random bytes, base64
    found = find_key(session, key)
    assert found is not None and (found.name, found.tenant, found.scope) == ("ci", "acme", "admin")
    assert find_key(session, key + "x") is None and find_key(session, key[:-1]) is None
    assert has_active_keys(session)
    assert revoke_key(session, "ci") and not revoke_key(session, "ci")
    assert find_key(session, key) is None and not has_active_keys(session)
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        create_key(session, "ci")  # names stay unique, revoked or not
    session.rollback()
    assert find_key(session, replace_key(session, "ci")) is not None
    assert [record.name for record in list_keys(session)] == ["ci"]


def test_bad_tenant_names_are_refused(session: Session) -> None:
    for tenant in ("", "a b", "x" * 65, "../etc", "a:b"):
        with pytest.raises(ValueError, match="tenant"):
            create_key(session, f"k-{len(tenant)}", tenant)


def test_the_keys_table_holds_no_key_in_plain_text(session: Session) -> None:
    keys = [create_key(session, f"key-{index}", "acme") for index in range(3)]
    rows = session.execute(sqlalchemy.text("SELECT * FROM api_keys")).all()
    cells = " ".join(str(cell) for row in rows for cell in row)
    for key in keys:
        secret = key.removeprefix(KEY_PREFIX)
        assert secret not in cells and secret[:12] not in cells
        assert hashlib.sha256(key.encode()).hexdigest() in cells  # what is kept instead


def insert_file(tenant: str | None) -> sqlalchemy.TextClause:
    """A file row with Idempotency-Key "same-key", as `tenant`'s (None: before the tenant column existed)."""
    columns, values = ("", "") if tenant is None else (", tenant", f", '{tenant}'")
    return sqlalchemy.text(
        f"INSERT INTO files (id, purpose, filename, bytes, created_at, content, idempotency_key{columns}) "
        f"VALUES (:id, 'batch', 'in.jsonl', 1, 1, :content, 'same-key'{values})"
    )


def test_the_migration_gives_old_rows_to_default_and_keys_per_tenant(database_url: str) -> None:
    alembic_config = AlembicConfig(str(REPO_ROOT / "alembic.ini"))
    alembic_config.attributes["skip_logging"] = True
    alembic_config.set_main_option("sqlalchemy.url", database_url)
    command.upgrade(alembic_config, "0010")
    engine = make_db_engine(database_url)
    with engine.begin() as connection:
        connection.execute(insert_file(None), {"id": "file-old", "content": b"x"})
    upgrade_to_head(database_url)
    with engine.begin() as connection:
        assert connection.execute(sqlalchemy.text("SELECT tenant FROM files")).scalar_one() == "default"
        connection.execute(insert_file("b"), {"id": "file-b", "content": b"y"})  # another tenant, the same key: fine
    with pytest.raises(sqlalchemy.exc.IntegrityError), engine.begin() as connection:
        connection.execute(insert_file("b"), {"id": "file-b2", "content": b"z"})  # the same tenant twice: refused
    engine.dispose()
    command.downgrade(alembic_config, "0010")  # drops b's key, which can no longer be unique across the table
    command.downgrade(alembic_config, "base")
