"""Alembic environment: the metadata of tasks.store.models, the URL from the caller or the Config."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context

import tasks.batches.models  # registers the Batch API tables on Base.metadata
import tasks.store.api_keys  # registers the keys table on Base.metadata
import tasks.store.conversation_models  # registers the Conversations API tables on Base.metadata
import tasks.store.response_models  # noqa: F401  (registers the Responses API table on Base.metadata)
from tasks.config import Config
from tasks.store.db import make_db_engine
from tasks.store.models import Base

alembic_config = context.config
if alembic_config.config_file_name and not alembic_config.attributes.get("skip_logging"):
    fileConfig(alembic_config.config_file_name, disable_existing_loggers=False)

database_url = alembic_config.get_main_option("sqlalchemy.url") or Config.from_env().database_url


def run_offline() -> None:
    context.configure(url=database_url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = make_db_engine(database_url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
