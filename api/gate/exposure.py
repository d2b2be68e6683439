"""Whether the api may serve with no key at all: only on a loopback address, where it runs open (and says so loudly);
anywhere else it refuses to start."""

from __future__ import annotations

import ipaddress
import logging

import sqlalchemy.exc

from tasks.config import Config
from tasks.store.api_keys import has_active_keys
from tasks.store.db import make_db_engine, make_session_factory
from tasks.store.tenants import DEFAULT_TENANT

logger = logging.getLogger(__name__)


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"; any other name or address may be reachable from elsewhere."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(config: Config, hosts: list[str]) -> None:
    """Raise RuntimeError, with the reason, when no key exists and a bound host is not loopback; log a warning when
    the api is about to run open on loopback. `hosts` are the addresses the server binds."""
    if config.api_key or _has_keys(config):
        return
    exposed = [host for host in hosts if not is_loopback(host)]
    if exposed:
        raise RuntimeError(
            f"refusing to serve on {', '.join(exposed)} with no API key: anyone who can reach it could use it. "
            "Create a key (python -m scripts.cli.api_keys create --name NAME --admin), set API_KEY, "
            "or bind a loopback address (HOST=127.0.0.1)."
        )
    logger.warning(
        "no API key exists: the api is open to clients on this machine, all as tenant %r with admin scope. "
        "Create one with: python -m scripts.cli.api_keys create --name NAME --admin",
        DEFAULT_TENANT,
    )


def _has_keys(config: Config) -> bool:
    engine = make_db_engine(config.database_url)
    try:
        with make_session_factory(engine)() as session:
            return has_active_keys(session)
    except sqlalchemy.exc.SQLAlchemyError as exc:
        # the class name only: the message may hold the database URL, credentials included
        raise RuntimeError(f"cannot read the API keys from the database ({type(exc).__name__})") from None
    finally:
        engine.dispose()
