"""Flower never runs with a default password: `make serve` generates one on the first run, keeps it in a 0600 file
and shows it once; FLOWER_BASIC_AUTH wins when set; the launcher refuses Flower without one."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from scripts.flower_password import flower_basic_auth
from scripts.stack import Stack
from tasks.config import Config


def test_a_password_is_generated_once_kept_private_and_shown_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "var" / "flower_password"
    first = flower_basic_auth(Config(), path)
    user, password = first.split(":", 1)
    assert user == "admin" and len(password) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert password in capsys.readouterr().out
    assert flower_basic_auth(Config(), path) == first
    assert capsys.readouterr().out == ""  # shown the first time only
    assert flower_basic_auth(Config(), tmp_path / "other") != first  # random, not a default


def test_flower_basic_auth_wins_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "flower_password"
    assert flower_basic_auth(Config(flower_basic_auth="ops:s3cret"), path) == "ops:s3cret"
    assert not path.exists()


def test_the_launcher_never_starts_flower_without_a_password(tmp_path: Path) -> None:
    config = Config(is_redis_embedded=False, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    stack = Stack(config)
    with pytest.raises(ValueError, match="FLOWER_BASIC_AUTH"):
        stack.start(with_flower=True, ready_timeout_s=1)
    assert stack.processes == [] and not (tmp_path / "db.sqlite").exists()  # refused before anything started
