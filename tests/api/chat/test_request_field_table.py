"""The README's table of request fields names every field chat and completions take, so it cannot go stale."""

from __future__ import annotations

import re

from api.chat.schemas import ChatCompletionRequest, CompletionRequest
from tasks.config import REPO_ROOT

SECTION = "### Every request field"
STATUSES = {"honoured", "recorded", "ignored", "refused"}
ENDPOINTS = {"both", "chat", "completions", "both / chat"}


def table_rows() -> list[list[str]]:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split(SECTION, 1)[1].split("\n#", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row] for row in rows]


def test_every_field_of_the_models_is_in_the_table() -> None:
    listed = {name for row in table_rows() for name in re.findall(r"`([a-z_]+)`", row[0])}
    for model in (ChatCompletionRequest, CompletionRequest):
        fields = {field.alias or name for name, field in model.model_fields.items()}
        assert fields - listed == set(), f"{model.__name__} fields missing from the README's table"


def test_every_row_says_where_and_what() -> None:
    rows = table_rows()
    assert len(rows) > 20
    for row in rows:
        assert row[1] in ENDPOINTS and row[2] in STATUSES, row
