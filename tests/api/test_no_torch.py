"""The api process never imports torch, even while it tokenizes and serves a request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tasks.config import REPO_ROOT
from tests.conftest import free_port

PROBE = """
import sys
from api.app import create_app
from tasks.config import Config
# Redis on a closed port: the request is validated and tokenized with the chat template, then answered 503.
config = Config(model=sys.argv[1], database_url="sqlite://", redis_url=f"redis://127.0.0.1:{sys.argv[2]}/0")
app = create_app(config)
body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
assert app.test_client().post("/v1/chat/completions", json=body).status_code == 503
# and with a grammar to check, which the api compiles (with llguidance) before queueing
tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
constrained = {**body, "tools": [tool], "tool_choice": "required", "stop": ["x"]}
assert app.test_client().post("/v1/chat/completions", json=constrained).status_code == 503
schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
assert app.test_client().post("/v1/chat/completions", json={**body, "response_format": schema}).status_code == 503
assert "torch" not in sys.modules, "the api imported torch"
"""


def test_api_never_imports_torch(tiny_model_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_model_dir), str(free_port())],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
