"""The storage types every layer shares: what a loader is, what a buffer is, how a URL splits.

This module imports only the standard library, so ``format/``, ``writers/``,
``provenance/`` and the coordinator take their types from here, never from an
implementation module (:mod:`ptestore.storage.loaders` imports fsspec).
"""

from __future__ import annotations

import os
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = [
    "Buffer",
    "DataLoader",
    "StorageURL",
    "URLLike",
    "load_into",
    "split_url",
    "strerror",
]

#: Bytes as ptestore takes them: anything read by a loader or handed to a writer.
Buffer = bytes | bytearray | memoryview


@runtime_checkable
class DataLoader(Protocol):
    """Read-only, random-access view of one stored object."""

    #: The path or URL the bytes come from; used in every error message.
    name: str

    def size(self) -> int:
        """Total size of the object in bytes."""
        ...

    def load(self, offset: int, size: int) -> Buffer:
        """Return exactly ``size`` bytes starting at ``offset``.

        Raises :class:`~ptestore.errors.StorageError` if the range is outside the object.
        """
        ...

    def check_unchanged(self) -> None:
        """Raise :class:`~ptestore.errors.StorageError` if the object was modified or
        replaced since the loader was opened (its bytes may then be a mix of two
        versions). Called before publishing anything derived from it."""
        ...

    def close(self) -> None:
        """Release any resources; idempotent."""
        ...


def load_into(loader: DataLoader, offset: int, buffer: memoryview) -> None:
    """Fill all of ``buffer`` (writable, bytes) with ``loader``'s bytes at ``offset``:
    straight into it where the loader reads into memory it is given (``readinto``: local
    files, by ``preadv``), else one :meth:`~DataLoader.load` copied in."""
    readinto = getattr(loader, "readinto", None)
    if readinto is not None:
        readinto(offset, buffer)
        return
    buffer[:] = memoryview(loader.load(offset, buffer.nbytes)).cast("B")


def split_url(url: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(protocol, path)``; plain paths and ``file://`` give ``("file", abspath)``."""
    text = os.fspath(url)
    if "://" not in text:
        return "file", os.path.abspath(text)
    protocol, _, rest = text.partition("://")
    protocol = protocol.lower()
    if protocol in ("file", "local"):
        return "file", os.path.abspath(rest if rest.startswith("/") else "/" + rest)
    if protocol in ("s3", "s3a"):
        return "s3", rest
    if protocol == "memory":
        return "memory", "/" + rest.lstrip("/")
    return protocol, text


class StorageURL(NamedTuple):
    """A path or URL split once (by :func:`split_url`): what it was given as, its
    protocol and its path. ``open_loader``, ``open_writer`` and the option routing
    (:mod:`ptestore.storage.routing`) take one in place of a string, so a URL is split
    once however many of them look at it."""

    #: The path or URL as given (``os.fspath``).
    text: str
    #: ``"file"`` for plain paths and ``file://``, ``"s3"`` for ``s3a://`` too, ...
    protocol: str
    #: As :func:`split_url` returns it (absolute for local files).
    path: str

    @classmethod
    def of(cls, url: str | os.PathLike[str] | StorageURL) -> StorageURL:
        """``url`` split (a :class:`StorageURL` is returned as it is)."""
        if isinstance(url, StorageURL):
            return url
        text = os.fspath(url)
        return cls(text, *split_url(text))

    @property
    def local(self) -> bool:
        """A local file (plain path or ``file://``): it takes no storage options."""
        return self.protocol == "file"


#: What ``open_loader``, ``open_writer`` and the option routing take as a URL.
URLLike = str | os.PathLike[str] | StorageURL


def strerror(exc: OSError) -> str:
    """The system's text for an ``OSError`` (its ``strerror``, else its ``str``)."""
    return exc.strerror or str(exc)
