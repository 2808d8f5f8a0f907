"""A local file system's failure as ptestore's error: what rerunning cannot change is bad
input (exit 2), the rest a :class:`~ptestore.errors.StorageError`."""

from __future__ import annotations

from .errors import ConfigurationError, ObjectNotFound, PermissionDenied, StorageError

__all__ = ["local_error"]


def local_error(exc: OSError, message: str) -> StorageError | ConfigurationError:
    """The error for a local file-system failure ``exc`` with ``message``: what rerunning
    cannot change is bad input (exit 2): access refused (EACCES, EPERM) is
    :class:`PermissionDenied`, a component of the path that is not a directory (ENOTDIR,
    ``m.pte/x.pte``) :class:`ObjectNotFound` as a missing one (ENOENT) is, a name or path
    longer than the file system takes (ENAMETOOLONG) :class:`ConfigurationError`, its
    message saying which and the limit (:func:`ptestore._names.too_long`); anything
    else :class:`StorageError`."""
    import errno

    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return PermissionDenied(message, errno=exc.errno)
    if exc.errno == errno.ENOTDIR:
        return ObjectNotFound(message, errno=exc.errno)
    if exc.errno == errno.ENAMETOOLONG:
        from ._names import too_long

        why = too_long(exc.filename) if isinstance(exc.filename, str) else None
        return ConfigurationError(message if why is None else f"{message} ({why})")
    return StorageError(message, errno=exc.errno)
