"""Version tokens for compare-and-swap publishes (``publish(mode="if-match")``).

A read-modify-write that loses no concurrent update::

    from ptestore.writers import open_writer
    from ptestore.writers.versions import read_versioned

    current = read_versioned(url)              # bytes + version token (None: absent)
    w = open_writer(url)
    w.write(change(current.data), 0)
    w.publish(current.mode, expected=current.version)   # "if-match", or "create"

A :class:`~ptestore.errors.PreconditionFailed` (another writer got there first) or an
:class:`~ptestore.errors.AlreadyExists` (someone created it first) means: read again and
redo the change. What a token is, per store:

=========  =================================================================
store      version token
=========  =================================================================
local      ``"sha256:<hex>"`` of the file's bytes (:mod:`._local_cas` says why)
memory     a number from one process-wide counter, never reused
S3         the object's ETag (as S3 returns it, quotes included)
=========  =================================================================

Other fsspec stores have no token: both functions raise
:class:`~ptestore.errors.ConfigurationError` for them, as ``publish("if-match")`` does.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigurationError
from ..storage.types import StorageURL
from .base import Versioned

__all__ = ["Versioned", "current_version", "read_versioned"]


def _no_options(url: StorageURL, options: dict[str, Any]) -> None:
    if options:
        raise ConfigurationError(
            f"{url.text}: local files take no storage options, got {sorted(options)}"
        )


def _unsupported(url: StorageURL) -> ConfigurationError:
    return ConfigurationError(
        f"{url.text}: {url.protocol}:// objects have no version token: compare-and-swap "
        "(publish mode 'if-match') needs a local file, memory:// or s3://"
    )


def read_versioned(url: str | os.PathLike[str] | StorageURL, **storage_options: Any) -> Versioned:
    """The object's bytes and their version token, read together (the bytes are those
    of that version); ``Versioned(b"", None)`` when there is no object."""
    u = StorageURL.of(url)
    if u.local:
        from ._local_cas import read_file_versioned

        _no_options(u, storage_options)
        return read_file_versioned(u.path)
    if u.protocol == "memory":
        from .memory import memory_read_versioned

        return memory_read_versioned(u.text, **storage_options)
    if u.protocol == "s3":
        from .s3.versions import s3_read_versioned

        return s3_read_versioned(u.text, **storage_options)
    raise _unsupported(u)


def current_version(url: str | os.PathLike[str] | StorageURL, **storage_options: Any) -> str | None:
    """The version token of the object at ``url`` now, or None when there is none
    (S3: one HEAD; local: a hash of the file; memory: a look-up)."""
    u = StorageURL.of(url)
    if u.local:
        from ._local_cas import file_version

        _no_options(u, storage_options)
        return file_version(u.path)
    if u.protocol == "memory":
        from .memory import memory_current_version

        return memory_current_version(u.text, **storage_options)
    if u.protocol == "s3":
        from .s3.versions import s3_current_version

        return s3_current_version(u.text, **storage_options)
    raise _unsupported(u)
