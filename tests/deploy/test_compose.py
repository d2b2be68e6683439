"""The deployment files' defaults: only the api's port is published, Redis wants a password and keeps an AOF,
PostgreSQL's and Flower's passwords come from the environment (no defaults), the image runs as a non-root user, and
`.env` never reaches git. Rendered with `docker-compose config` where it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tasks.config import REPO_ROOT

SECRETS = {"POSTGRES_PASSWORD": "pg-secret-1", "REDIS_PASSWORD": "redis-secret-2", "FLOWER_PASSWORD": "flower-3"}


def render(env_file: Path) -> subprocess.CompletedProcess:
    command = ["docker-compose", "--project-directory", str(REPO_ROOT), "--env-file", str(env_file), "config"]
    return subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin:/usr/local/bin"}
    )


needs_compose = pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")


@needs_compose
def test_compose_publishes_only_the_api_and_takes_every_secret_from_the_environment(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in SECRETS.items()))
    rendered = render(env_file)
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(rendered.stdout)["services"]
    assert {name for name, service in services.items() if service.get("ports")} == {"api"}
    assert [port["target"] for port in services["api"]["ports"]] == [8000]
    redis_command = " ".join(services["redis"]["command"])
    assert "--requirepass" in redis_command and "--appendonly yes" in redis_command
    assert services["redis"]["environment"]["REDIS_PASSWORD"] == SECRETS["REDIS_PASSWORD"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == SECRETS["POSTGRES_PASSWORD"]
    assert services["api"]["environment"]["REDIS_URL"] == f"redis://:{SECRETS['REDIS_PASSWORD']}@redis:6379/0"
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == f"admin:{SECRETS['FLOWER_PASSWORD']}"
    assert "FLOWER_BASIC_AUTH" not in " ".join(services["flower"]["command"])  # not in argv, where ps shows it


@needs_compose
@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_render_without_a_secret(tmp_path: Path, missing: str) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in SECRETS.items() if name != missing))
    rendered = render(env_file)
    assert rendered.returncode != 0 and missing in rendered.stderr


def test_no_default_password_and_a_non_root_image() -> None:
    compose = (REPO_ROOT / "docker-compose.yml").read_text()
    assert "steerbatch:steerbatch@" not in compose and "admin:steerbatch" not in compose
    users = [
        line.split()[1] for line in (REPO_ROOT / "Dockerfile").read_text().splitlines() if line.startswith("USER ")
    ]
    assert users and users[-1] not in ("root", "0")
    assert ".env" in (REPO_ROOT / ".gitignore").read_text().splitlines()
    example = dict(
        line.split("=", 1)
        for line in (REPO_ROOT / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert all(example[name] == "" for name in SECRETS)  # nothing to copy and forget to change
