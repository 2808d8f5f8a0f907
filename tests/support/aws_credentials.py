"""A shared credentials file a test rewrites as a sidecar rotating keys does
(``AWS_SHARED_CREDENTIALS_FILE``), with the process's other credential sources out of
the way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["use_credentials_file", "write_credentials"]


def use_credentials_file(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Credentials come from the file at ``path`` alone (no ``AWS_*`` keys, token or
    profile from the environment), for the test's duration."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))


def write_credentials(path: Path, key: str, secret: str) -> None:
    """Rewrite the credentials file as a sidecar does, its modification time moved on
    (a file system's clock may not tick between two writes)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    now = max(path.stat().st_mtime_ns, before + 1_000_000_000)
    os.utime(path, ns=(now, now))
