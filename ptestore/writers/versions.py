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
memory     ``"sha256:<hex>"`` of the object's bytes, as for local files
S3         the object's ETag (as S3 returns it, quotes included)
=========  =================================================================

Other fsspec stores have no token: both functions raise
:class:`~ptestore.errors.ConfigurationError` for them, as ``publish("if-match")`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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


# The three stores that have version tokens, each as (read_versioned, current_version),
# imported when first asked (plain imports, so the import graph sees them). A local file
# is read by path and takes no storage options; the others by URL text.
_Pair = tuple[Callable[..., Versioned], Callable[..., str | None]]


def _local_store() -> _Pair:
    from ._local_cas import file_version, read_file_versioned

    return read_file_versioned, file_version


def _memory_store() -> _Pair:
    from .memory import memory_current_version, memory_read_versioned

    return memory_read_versioned, memory_current_version


def _s3_store() -> _Pair:
    from .s3.versions import s3_current_version, s3_read_versioned

    return s3_read_versioned, s3_current_version


_STORES: dict[str, Callable[[], _Pair]] = {
    "file": _local_store,
    "memory": _memory_store,
    "s3": _s3_store,
}


def _dispatch(
    url: str | os.PathLike[str] | StorageURL,
    which: int,
    storage_options: dict[str, Any],
    **extra: Any,
) -> Any:
    """Call the store's function number ``which`` (0: read, 1: version) for ``url``."""
    u = StorageURL.of(url)
    store = _STORES.get(u.protocol)
    if store is None:
        raise _unsupported(u)
    fn = store()[which]
    if u.local:
        _no_options(u, storage_options)
        return fn(u.path, **extra)
    return fn(u.text, **extra, **storage_options)


def read_versioned(
    url: str | os.PathLike[str] | StorageURL,
    *,
    max_bytes: int | None = None,
    **storage_options: Any,
) -> Versioned:
    """The object's bytes and their version token, read together (the bytes are those
    of that version); ``Versioned(b"", None)`` when there is no object. An object larger
    than ``max_bytes`` is not held: ``Versioned(b"", its version, oversize=its size)``
    (S3: its body is not downloaded; a local file is hashed a piece at a time)."""
    extra = {} if max_bytes is None else {"max_bytes": max_bytes}
    result: Versioned = _dispatch(url, 0, storage_options, **extra)
    return result


def current_version(url: str | os.PathLike[str] | StorageURL, **storage_options: Any) -> str | None:
    """The version token of the object at ``url`` now, or None when there is none
    (S3: one HEAD; local: a hash of the file; memory: a look-up)."""
    result: str | None = _dispatch(url, 1, storage_options)
    return result
