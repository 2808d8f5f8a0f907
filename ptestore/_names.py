"""The local file system's limits on names, for messages: NAME_MAX (bytes per name) and
PATH_MAX (bytes per path), as the file system of the nearest existing directory tells
them (``pathconf``), and which of them a path is over (:func:`too_long`): what
:func:`ptestore._oserror.local_error` adds to an ENAMETOOLONG, and what a local writer
refuses before any work (:func:`ptestore.writers._dirs.check_name_lengths`).
Standard library only, with :mod:`ptestore._text`."""

from __future__ import annotations

import os

__all__ = ["too_long"]

#: The limits where the file system does not say (``pathconf`` fails): Linux's and macOS's.
_DEFAULTS = {"PC_NAME_MAX": 255, "PC_PATH_MAX": 4096}
#: POSIX's smallest NAME_MAX and PATH_MAX: no file system refuses less (no ``pathconf``).
_SAFE_NAME, _SAFE_PATH = 14, 256


def _limit(directory: str, name: str) -> int:
    try:
        value = os.pathconf(directory, name)
    except (OSError, ValueError):
        value = -1
    return value if value > 0 else _DEFAULTS[name]


def too_long(path: str, *, whole: bool = True) -> str | None:
    """What of ``path`` is over the file system's limit, with the limit, in words: the
    longest of its names below its nearest existing directory (the file's, those a
    ``mkdir`` would make) against NAME_MAX, else (``whole``) its length against
    PATH_MAX; None when neither is (or a limit the system does not tell)."""
    directory, names = os.path.split(os.path.abspath(path))
    names_below = [names]
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory, name = os.path.split(directory)
        names_below.append(name)
    longest = max(names_below, key=lambda n: len(os.fsencode(n)))
    size, total = len(os.fsencode(longest)), len(os.fsencode(path))
    if size <= _SAFE_NAME and (not whole or total < _SAFE_PATH):
        return None
    name_max = _limit(directory, "PC_NAME_MAX")
    if size > name_max:
        from ._text import shown

        return (
            f"the name {shown(longest, 40)} is {size} bytes long, over the file system's "
            f"limit of {name_max} bytes per name (NAME_MAX)"
        )
    path_max = _limit(directory, "PC_PATH_MAX")
    if whole and total >= path_max:  # PATH_MAX counts the terminating NUL
        return (
            f"the path is {total} bytes long, over the system's limit of {path_max} bytes "
            "per path (PATH_MAX, its terminating NUL included)"
        )
    return None
