"""The cache is this user's alone, as ssh wants its files: a cache path owned by another
user, or writable by group or others, is refused (:func:`check_private`), and the
files the cache makes lose group and others' write before they are recorded
(:func:`make_private`)."""

from __future__ import annotations

import os
import stat

from ..errors import PermissionDenied, StorageError

__all__ = ["SHARED_WRITE", "check_private", "make_private"]

#: Write permission for group or others: what makes a cache path another user's too.
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _owner(uid: int) -> str:
    import pwd  # only for an error message

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_private(path: str, what: str, st: os.stat_result | None = None) -> None:
    """Refuse ``path`` (a cache directory, an entry, its manifest) unless it is this
    user's alone, as ssh does with its files: owned by this user (or root) and not
    writable by group or others. A missing path is not checked. Raises
    :class:`~ptestore.errors.PermissionDenied` naming the path, its owner and mode, and
    the fix."""
    if st is None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"{path}: cannot stat the {what}: {exc.strerror}") from exc
    me = os.geteuid()
    foreign = st.st_uid not in (me, 0)
    shared = bool(st.st_mode & SHARED_WRITE)
    if not foreign and not shared:
        return
    mode = stat.S_IMODE(st.st_mode)
    problems, fixes = [], []
    if foreign:
        problems.append(f"is owned by {_owner(st.st_uid)}, not by this user ({_owner(me)})")
        fixes.append(f"chown {me} {path}")
    if shared:
        who = " and ".join(
            w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if mode & bit
        )
        problems.append(f"is writable by {who} (mode {mode:04o})")
        fixes.append(f"chmod go-w {path}")
    raise PermissionDenied(
        f"{path}: the {what} {' and '.join(problems)}: another user could plant, change "
        f"or remove what ensure serves from it; ptestore uses only a cache that is this "
        f"user's alone. Fix: {'; '.join(fixes)} (or use another --cache-dir)"
    )


def make_private(path: str) -> None:
    """Remove group and others' write permission from an entry's file (made under the
    umask: ``0o664`` under ``umask 002``), before its stamp is recorded."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & SHARED_WRITE:
        os.chmod(path, mode & ~SHARED_WRITE)
