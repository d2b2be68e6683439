"""Database engine, sessions and migrations, from the one Config's DATABASE_URL."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from tasks.config import REPO_ROOT

SessionFactory = sessionmaker[Session]


def make_db_engine(database_url: str) -> Engine:
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, connect_args=_connect_timeout(url.get_backend_name()))
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30})
    event.listen(engine, "connect", _tune_sqlite)
    return engine


def _connect_timeout(backend: str) -> dict[str, int]:
    return {"connect_timeout": 3} if backend == "postgresql" else {}


def _tune_sqlite(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    # WAL lets the api read while a worker writes; busy_timeout waits out the other process's lock. synchronous=NORMAL:
    # a commit does not wait for fsync (5-7 ms each on this machine's disk, three per request: the api's insert, the
    # worker's claim and its result, each holding up the api's event loop or a first token). A process that crashes
    # loses nothing; a power loss may lose the last commits, never consistency. PostgreSQL is the durable choice.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_session_factory(engine: Engine) -> SessionFactory:
    return sessionmaker(engine, expire_on_commit=False)


def upgrade_to_head(database_url: str) -> None:
    """Apply every Alembic migration; safe to run on every start."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # before the import, which logs its plugins at INFO
    from alembic import command
    from alembic.config import Config as AlembicConfig

    make_db_engine(database_url).dispose()  # creates the SQLite file's folder
    alembic_config = AlembicConfig(str(REPO_ROOT / "alembic.ini"))
    alembic_config.attributes["skip_logging"] = True  # env.py's fileConfig would reset this process's root logger
    alembic_config.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    alembic_config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    command.upgrade(alembic_config, "head")
