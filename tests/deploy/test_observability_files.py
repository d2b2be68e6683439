"""The Prometheus scrape config and the Grafana dashboard: the scrape sends a bearer key from a file, the dashboard
reads the provisioned data source, and every metric it queries is one that /metrics exports."""

from __future__ import annotations

import json
import re

import yaml

from tasks.config import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
METRIC_SOURCES = [REPO_ROOT / "worker" / "serving" / "metrics.py", *(REPO_ROOT / "api" / "observability").glob("*.py")]
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def test_prometheus_scrapes_the_api_with_a_key_file() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == ["api:8000"]
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]


def test_dashboard_queries_exported_metrics_on_the_provisioned_source() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "steerbatch.json").read_text())
    sources = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = sources["datasources"][0]["uid"]
    targets = [target for panel in dashboard["panels"] for target in panel["targets"]]
    assert {target["datasource"]["uid"] for target in targets} == {uid}
    exported = "\n".join(path.read_text() for path in METRIC_SOURCES)
    for name in {name for target in targets for name in re.findall(r"steerbatch:([a-z0-9_]+)", target["expr"])}:
        base = next((name.removesuffix(suffix) for suffix in SUFFIXES if name.endswith(suffix)), name)
        is_exported = f'"{base}"' in exported or f'}}{base}"' in exported  # "name" or f"{METRIC_PREFIX}name"
        assert is_exported, f"the dashboard queries {name}, which nothing exports"
