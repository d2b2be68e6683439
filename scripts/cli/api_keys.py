"""Create, list and revoke API keys in the database DATABASE_URL names (migrated to head first).

    python -m scripts.cli.api_keys create --name NAME [--tenant TENANT] [--admin]   # prints the new key, and only it
    python -m scripts.cli.api_keys list
    python -m scripts.cli.api_keys revoke NAME

The key is shown once, on stdout (so `export STEERBATCH_API_KEY=$(python -m scripts.cli.api_keys create ...)` works);
the database keeps only its SHA-256 digest. A revoked key is refused by the api within a second.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime, timezone

import sqlalchemy.exc

from tasks.config import Config
from tasks.logs import configure_logging
from tasks.store.api_keys import ApiKeyRecord, Scope, create_key, list_keys, revoke_key
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tasks.store.tenants import DEFAULT_TENANT

logger = logging.getLogger("api_keys")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.cli.api_keys", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="make a key and print it (once)")
    create.add_argument("--name", required=True, help="unique; what logs and `list` show")
    create.add_argument("--tenant", default=DEFAULT_TENANT, help="who owns what the key creates")
    create.add_argument("--admin", action="store_true", help="may change the worker-wide steering profile and monitor")
    commands.add_parser("list", help="every key's name, tenant, scope, times and state (never the key)")
    revoke = commands.add_parser("revoke", help="refuse the key from now on")
    revoke.add_argument("name")
    return parser.parse_args(argv)


def describe(record: ApiKeyRecord) -> str:
    state = "revoked" if record.revoked else "active"
    fields = (record.name, record.tenant, record.scope, _when(record.created_at), _when(record.last_used_at), state)
    return "\t".join(fields)


def _when(unix_s: float | None) -> str:
    return "never" if unix_s is None else datetime.fromtimestamp(unix_s, timezone.utc).isoformat(timespec="seconds")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = Config.from_env()
    configure_logging(config)  # to stderr: stdout carries only the command's output
    upgrade_to_head(config.database_url)
    with make_session_factory(make_db_engine(config.database_url))() as session:
        if args.command == "create":
            scope = Scope.ADMIN if args.admin else Scope.USER
            try:
                key = create_key(session, args.name, args.tenant, scope)
            except (ValueError, sqlalchemy.exc.IntegrityError) as exc:
                reason = "a key with that name exists" if isinstance(exc, sqlalchemy.exc.IntegrityError) else exc
                logger.error("no key created: %s", reason)
                return 1
            logger.info("created key %s (tenant %s, scope %s)", args.name, args.tenant, scope.value)
            sys.stdout.write(key + "\n")
        elif args.command == "list":
            sys.stdout.write("name\ttenant\tscope\tcreated\tlast used\tstate\n")
            sys.stdout.writelines(describe(record) + "\n" for record in list_keys(session))
        elif not revoke_key(session, args.name):
            logger.error("no active key named %s", args.name)
            return 1
        else:
            logger.info("revoked key %s", args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
