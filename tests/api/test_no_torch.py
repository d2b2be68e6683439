"""The api process never imports torch, even while it tokenizes and serves a request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tasks.config import REPO_ROOT

PROBE = """
import sys
from api.app import create_app
from tasks.config import Config
app = create_app(Config(model=sys.argv[1], database_url="sqlite://"))
client = app.test_client()
client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 3})
assert app.extensions["steerbatch"].model_info.tokenizer.encode("hello")
assert "torch" not in sys.modules, "the api imported torch"
"""


def test_api_never_imports_torch(tiny_model_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tiny_model_dir)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
