"""Where an in-place run's journal is, and the one-``stat`` check every entry point makes
(importing nothing heavy: the in-place machinery is loaded only when a journal exists)."""

from __future__ import annotations

import os

__all__ = ["journal_path", "recover_if_local"]


def journal_path(path: str) -> str:
    """The journal of the file at ``path``: ``.<name>.ptestore-journal`` beside it."""
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{name}.ptestore-journal")


def recover_if_local(url: str | os.PathLike[str]) -> None:
    """:func:`ptestore.recover` for a local path with a journal beside it; nothing for a
    URL of another scheme or a file without one (one ``lstat``)."""
    text = os.fspath(url)
    if "://" in text and not text.startswith("file://"):
        return
    target = os.path.realpath(text.removeprefix("file://"))
    if os.path.lexists(journal_path(target)):
        from .inplace import recover

        recover(target)
