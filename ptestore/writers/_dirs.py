"""The directories a local writer made for its destination (``auto_mkdir``), and their
removal when it discards: a failed write leaves no trace, not even an empty folder; and
the names it would make, checked against the file system's NAME_MAX first
(:func:`check_name_lengths`).

Only the directories this writer created (``mkdir`` succeeded here, not
``FileExistsError``) are removed, deepest first, each only while it is empty
(``rmdir``): a directory another writer made, or one another writer's staging file or
published output is in, stays. A writer that finds a directory it saw removed under it
(another writer's discard between its ``mkdir`` and its staging file) makes it again
(:class:`~ptestore.writers.local.LocalFileWriter`)."""

from __future__ import annotations

import os

__all__ = ["check_name_lengths", "make_parents", "remove_empty_tree", "remove_made"]


def check_name_lengths(path: str) -> None:
    """Refuse (:class:`~ptestore.errors.ConfigurationError` naming the name's length and
    the limit) an absolute ``path`` whose file name, or the name of a directory
    ``auto_mkdir`` would make, is longer in bytes than the file system of the nearest
    existing directory takes (``PC_NAME_MAX``, else 255: :func:`ptestore._names.too_long`):
    the staging name is cut to fit, so only the publish, after all the work, would find
    out."""
    from .._names import too_long

    why = too_long(path, whole=False)
    if why is not None:
        from ..errors import ConfigurationError

        raise ConfigurationError(f"{path}: {why}")


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


def remove_empty_tree(made: list[str]) -> None:
    """Remove every empty directory under the deepest of ``made`` (as
    :func:`make_parents` returns them), deepest first, then the directories of ``made``
    while they are empty: for the owner of a tree it made, a fleet run and its
    destination root (:func:`ptestore.fleet.preflight.make_root`), so everything under it
    was made since. A directory holding anything (a file, another's staging file, a
    symbolic link) stays, and so do those above it. Empties ``made``."""
    if not made:
        return
    for here, dirs, _files in os.walk(made[0], topdown=False):  # links are not followed
        for name in dirs:
            try:
                os.rmdir(os.path.join(here, name))
            except OSError:
                pass  # not empty (or a link: ENOTDIR), or gone: left as it is
    remove_made(made)
