"""The directories a local writer made for its destination (``auto_mkdir``), and their
removal when it discards: a failed write leaves no trace, not even an empty folder.

Only the directories this writer created (``mkdir`` succeeded here, not
``FileExistsError``) are removed, deepest first, each only while it is empty
(``rmdir``): a directory another writer made, or one another writer's staging file or
published output is in, stays. A writer that finds a directory it saw removed under it
(another writer's discard between its ``mkdir`` and its staging file) makes it again
(:class:`~ptestore.writers.local.LocalFileWriter`)."""

from __future__ import annotations

import os

__all__ = ["make_parents", "remove_made"]


def make_parents(directory: str) -> list[str]:
    """Create ``directory`` and its missing parents; the ones created by this call,
    deepest first. ``OSError`` as ``os.mkdir`` raises it."""
    missing: list[str] = []
    here = directory
    while here and not os.path.isdir(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    made: list[str] = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            continue  # made by someone else meanwhile: not ours to remove
        made.append(path)
    return made[::-1]


def remove_made(made: list[str]) -> None:
    """Remove the directories of ``made`` (deepest first) while they are empty; stop at
    the first that is not (or cannot be removed). Empties ``made``."""
    todo = list(made)
    made.clear()
    for path in todo:
        try:
            os.rmdir(path)
        except OSError:
            return
