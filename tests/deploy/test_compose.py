"""The deployment files' defaults: only the api's port is published (and Grafana's, on loopback), Redis wants a
password and keeps an AOF, PostgreSQL's and Flower's passwords come from the environment (no defaults), the image runs
as a non-root user, and `.env` never reaches git; each profile (cpu, gpu, monitoring) is a whole stack: what it
starts depends only on what it starts, the cpu one reserves no GPU and builds the tiny model, the gpu one has a worker
per device. Rendered with `docker-compose config` where it is installed (no Docker daemon is needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tasks.config import REPO_ROOT

SECRETS = {"POSTGRES_PASSWORD": "pg-secret-1", "REDIS_PASSWORD": "redis-secret-2", "FLOWER_PASSWORD": "flower-3"}


def render(env_file: Path, *profiles: str) -> subprocess.CompletedProcess:
    command = ["docker-compose", "--project-directory", str(REPO_ROOT), "--env-file", str(env_file)]
    command += [argument for profile in profiles for argument in ("--profile", profile)] + ["config"]
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
    assert {name for name, service in services.items() if service.get("ports")} == {"api", "grafana"}
    assert [port["target"] for port in services["api"]["ports"]] == [8000]
    assert all(port.startswith("127.0.0.1:") for port in services["grafana"]["ports"])
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


def active_services(env_file: Path, *profiles: str) -> dict[str, dict]:
    """The services `docker compose --profile ...` starts: those in no profile and those in one of `profiles`
    (docker-compose 1.29's `config` renders every service, each with its `profiles`)."""
    rendered = render(env_file, *profiles)
    assert rendered.returncode == 0, rendered.stderr
    services = yaml.safe_load(rendered.stdout)["services"]
    return {name: s for name, s in services.items() if not s.get("profiles") or set(s["profiles"]) & set(profiles)}


def gpu_devices(service: dict) -> list[str]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [device_id for device in reservations.get("devices", []) for device_id in device.get("device_ids", [])]


@needs_compose
@pytest.mark.parametrize("profiles", [("cpu",), ("gpu",), ("cpu", "monitoring"), ("gpu", "monitoring")])
def test_each_profile_is_a_whole_stack_that_restarts_and_reports_its_health(
    tmp_path: Path, profiles: tuple[str, ...]
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in SECRETS.items()))
    services = active_services(env_file, *profiles)
    assert {"redis", "postgres", "migrate", "tiny-model", "api", "flower"} <= set(services)
    assert any(name.startswith("worker-") for name in services)
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), f"{name} waits for a service not started"
        if service["restart"] == "no":  # the one-shot jobs
            assert name in ("migrate", "tiny-model")
        else:
            assert service["restart"] == "unless-stopped" and service.get("healthcheck"), name
    assert "8000/health" in " ".join(services["api"]["healthcheck"]["test"])
    if "monitoring" in profiles:
        volumes = services["prometheus"]["volumes"] + services["grafana"]["volumes"]
        for path in ("deploy/prometheus/prometheus.yml", "deploy/grafana/provisioning", "deploy/grafana/dashboards"):
            assert any(volume.startswith(f"{REPO_ROOT / path}:") for volume in volumes), path


@needs_compose
def test_the_cpu_profile_reserves_no_gpu_and_serves_the_tiny_model_it_builds(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in SECRETS.items()))
    services = active_services(env_file, "cpu")
    assert not any(gpu_devices(service) for service in services.values())
    [worker] = [service for name, service in services.items() if name.startswith("worker-")]
    assert worker["environment"]["DEVICE"] == "cpu"
    model = services["api"]["environment"]["MODEL"]
    assert model == worker["environment"]["MODEL"] and model in " ".join(services["tiny-model"]["command"])
    for name in ("api", "tiny-model", "worker-cpu"):  # one volume holds the built model for the builder and readers
        assert any(volume.startswith("built-models:/app/built") for volume in services[name]["volumes"]), name
    assert model.startswith("/app/built/")
    assert services["worker-cpu"]["depends_on"]["tiny-model"]["condition"] == "service_completed_successfully"


@needs_compose
def test_the_gpu_profile_pins_one_worker_per_device_and_takes_any_model(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    secrets = "".join(f"{name}={value}\n" for name, value in SECRETS.items())
    env_file.write_text(secrets + "MODEL=meta-llama/Llama-3.2-1B-Instruct\n")
    services = active_services(env_file, "gpu")
    workers = {name: service for name, service in services.items() if name.startswith("worker-")}
    assert workers and all(name.startswith("worker-gpu-") for name in workers)
    for worker in workers.values():
        assert gpu_devices(worker) == [worker["environment"]["CUDA_VISIBLE_DEVICES"]]
        assert worker["environment"]["MODEL"] == "meta-llama/Llama-3.2-1B-Instruct"
    assert len({worker["environment"]["CUDA_VISIBLE_DEVICES"] for worker in workers.values()}) == len(workers)
    assert services["api"]["environment"]["MODEL"] == "meta-llama/Llama-3.2-1B-Instruct"
