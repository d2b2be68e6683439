"""The SAEs under one configured root, addressed by id: the folder's path relative to the root.

An id never reaches outside the root: `..`, absolute paths and symlinks that resolve elsewhere are refused.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

from steering.sae import SAE
from steering.sae_config import CFG_FILENAME, WEIGHTS_FILENAME, SAEConfig

logger = logging.getLogger(__name__)

MAX_ID_LENGTH = 256


class SAELookupError(ValueError):
    """An sae_id that is malformed (`code` "invalid_sae_id") or names no SAE ("sae_not_found").

    The message names only the id, never a filesystem path, so it can go to a client as is.
    """

    def __init__(self, message: str, sae_id: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.sae_id = sae_id
        self.code = code


@dataclass(frozen=True)
class SAEListing:
    id: str
    hook_name: str
    d_in: int
    d_sae: int
    architecture: str

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "hook_name": self.hook_name,
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "architecture": self.architecture,
        }


class SAERegistry:
    """Lists and loads SAEs; a loaded SAE is cast to `device`/`dtype` once and cached. Thread-safe."""

    def __init__(self, root: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        self.root = Path(root).resolve()
        self.device = torch.device(device)
        self.dtype = dtype
        self._cache: dict[str, SAE] = {}
        self._lock = threading.Lock()

    def listings(self) -> list[SAEListing]:
        """Every folder under the root holding cfg.json and the weights; unreadable ones are logged and skipped."""
        listings = []
        for sae_id in self._find_ids():
            try:
                config = SAEConfig.read(self.resolve(sae_id))
            except ValueError as exc:
                logger.warning("skipping SAE %s: %s", sae_id, exc)
                continue
            listings.append(SAEListing(sae_id, config.hook_name, config.d_in, config.d_sae, config.architecture))
        return listings

    def get(self, sae_id: str) -> SAE:
        """The SAE on the registry's device and dtype; raises SAELookupError, or ValueError for bad files."""
        folder = self.resolve(sae_id)
        key = folder.relative_to(self.root).as_posix()
        with self._lock:
            if key not in self._cache:
                self._cache[key] = SAE.load(folder).to(self.device, self.dtype)
                logger.info(
                    "loaded SAE %s (%s) on %s as %s", key, self._cache[key].config.hook_name, self.device, self.dtype
                )
            return self._cache[key]

    def resolve(self, sae_id: str) -> Path:
        """The SAE's folder inside the root, with both files present and inside the root too."""
        parts = _split_id(sae_id)
        folder = self.root.joinpath(*parts).resolve()
        if not folder.is_relative_to(self.root):
            raise SAELookupError(f"sae_id {sae_id!r} resolves outside the SAE root", sae_id, "invalid_sae_id")
        for name in (CFG_FILENAME, WEIGHTS_FILENAME):
            path = (folder / name).resolve()
            if not path.is_relative_to(self.root) or not path.is_file():
                raise SAELookupError(f"unknown sae_id {sae_id!r}", sae_id, "sae_not_found")
        return folder

    def _find_ids(self) -> list[str]:
        if not self.root.is_dir():
            return []
        ids = []
        for directory, _, files in os.walk(self.root):
            if CFG_FILENAME in files and WEIGHTS_FILENAME in files:
                relative = Path(directory).relative_to(self.root)
                if relative.parts:
                    ids.append(relative.as_posix())
        return sorted(ids)


def _split_id(sae_id: object) -> tuple[str, ...]:
    if not isinstance(sae_id, str) or not sae_id or len(sae_id) > MAX_ID_LENGTH:
        raise SAELookupError(
            f"sae_id must be a non-empty string of at most {MAX_ID_LENGTH} characters", str(sae_id), "invalid_sae_id"
        )
    path = PurePosixPath(sae_id)
    if "\\" in sae_id or "\0" in sae_id or path.is_absolute():
        raise SAELookupError(
            f"sae_id {sae_id!r} must be a relative path like 'tiny/resid_post_2'", sae_id, "invalid_sae_id"
        )
    if any(part in ("..", ".") for part in sae_id.split("/")) or "" in sae_id.split("/"):
        raise SAELookupError(f"sae_id {sae_id!r} may not contain '.', '..' or empty parts", sae_id, "invalid_sae_id")
    return path.parts
