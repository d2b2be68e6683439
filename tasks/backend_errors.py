"""Which backing service an exception came from, for the api's and the workers' error counters."""

from __future__ import annotations

import kombu.exceptions
import redis
import sqlalchemy.exc

REDIS = "redis"
DATABASE = "database"


def backend_of(exc: BaseException) -> str | None:
    """ "redis" (the broker included), "database", or None for anything else."""
    if isinstance(exc, (redis.RedisError, kombu.exceptions.OperationalError)):
        return REDIS
    if isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
        return DATABASE
    return None
