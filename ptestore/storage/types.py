"""The storage types every layer shares: what a loader is, what a buffer is, how a URL splits.

This module imports only the standard library (and, to refuse a name, ptestore's errors
and how a value is shown; what a URL shows, :mod:`ptestore._redact`: all three standard
library only themselves), so ``format/``, ``writers/``, ``provenance/`` and the
coordinator take their types from here, never from an implementation module
(:mod:`ptestore.storage.loaders` imports fsspec).
"""

from __future__ import annotations

import os
from typing import NamedTuple, Protocol, runtime_checkable

from .._redact import (
    LOCAL_SCHEMES,
    REDACTED,
    is_redacted,
    redact_urls,
    redacted_url,
    url_identity,
)
from .._redact import SCHEME as _SCHEME

__all__ = [
    "LOCAL_SCHEMES",
    "REDACTED",
    "Buffer",
    "DataLoader",
    "StorageURL",
    "URLLike",
    "absolute_local",
    "absolute_path",
    "file_path",
    "is_redacted",
    "is_relative_local",
    "load_into",
    "loader_url",
    "local_path",
    "redact_urls",
    "redacted_url",
    "split_url",
    "strerror",
    "url_identity",
    "url_origin",
]

#: Bytes as ptestore takes them: anything read by a loader or handed to a writer.
Buffer = bytes | bytearray | memoryview


@runtime_checkable
class DataLoader(Protocol):
    """Read-only, random-access view of one stored object."""

    #: The path or URL the bytes come from, as it is shown (:func:`redacted_url`: the
    #: credentials a remote URL carries replaced by :data:`REDACTED`); used in every
    #: error message and recorded by provenance, never opened again, never compared
    #: (two URLs with their credentials redacted may name two objects: a loader's
    #: identity is :func:`loader_url`'s).
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
        """Raise :class:`~ptestore.errors.StorageError` (ptestore's loaders: its subclass
        :class:`~ptestore.errors.PreconditionFailed`) if the object was modified or
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


#: Schemes that are one protocol under another name.
_ALIASES = {"local": "file", "s3a": "s3"}


def absolute_path(path: str) -> str:
    """``path`` made absolute against the current directory WITHOUT normalizing it: a
    ``..`` stays for the kernel to resolve after the symbolic link before it
    (``lnk/../m.pte`` with ``lnk -> real/sub`` is ``real/m.pte``, where
    ``os.path.abspath`` would say ``m.pte``), and so does a trailing ``/``."""
    if not path:  # file:// alone: the current directory
        return os.getcwd()
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def split_url(url: str | os.PathLike[str]) -> tuple[str, str]:
    """Return ``(protocol, path)``: THE classification of a path or URL (see
    :class:`StorageURL`, which holds its result).

    - A plain path, and ``file://`` / ``local://`` in any letter case, give
      ``("file", absolute path)`` (:func:`absolute_path`: not normalized, the file
      system resolves ``.``, ``..`` and symbolic links); what follows ``file://`` is a
      local path, so ``file:///abs/m.pte`` is ``/abs/m.pte`` and ``file://rel/m.pte`` is
      ``rel/m.pte`` under the current directory, as for a plain path (and as fsspec
      reads it).
    - ``s3://`` and ``s3a://`` give ``("s3", "bucket/key")``; ``memory://x`` gives
      ``("memory", "/x")``; any other scheme gives ``(scheme, url)`` (lower-cased
      scheme, the URL as given).
    """
    text = os.fspath(url)
    match = _SCHEME.match(text)
    if match is None:
        return "file", absolute_path(text)
    scheme = match.group(1).lower()
    protocol = _ALIASES.get(scheme, scheme)
    rest = text[match.end() :]
    if protocol == "file":
        return "file", absolute_path(rest)
    if protocol == "s3":
        return "s3", rest
    if protocol == "memory":
        return "memory", "/" + rest.lstrip("/")
    return protocol, text


#: The port a URL without one means.
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def url_origin(url: str) -> tuple[str, str, str]:
    """``(protocol, host, port)`` of a URL naming its server (``https://user@Host/x``
    -> ``("https", "host", "443")``): the user information left out, the host in lower
    case without a final dot, the protocol's default port where none is given."""
    protocol, rest = url.split("://", 1) if "://" in url else ("", url)
    protocol = protocol.lower()
    authority = rest
    for end in "/?#":
        authority = authority.partition(end)[0]
    authority = authority.rpartition("@")[2]
    if authority.startswith("["):  # an IPv6 address: [::1]:8080
        host, _, after = authority[1:].partition("]")
        port = after[1:] if after.startswith(":") else ""
    else:
        host, _, port = authority.partition(":")
    return protocol, host.lower().rstrip("."), port or _DEFAULT_PORTS.get(protocol, "")


class StorageURL(NamedTuple):
    """A path or URL split once (by :func:`split_url`): what it was given as, its
    protocol and its path. ``open_loader``, ``open_writer`` and the option routing
    (:mod:`ptestore.storage.routing`) take one in place of a string, so a URL is split
    once however many of them look at it. Every "is this local, and where?" question in
    ptestore is asked of one (:attr:`local`, :attr:`path`, :attr:`location`)."""

    #: The path or URL as given (``os.fspath``).
    text: str
    #: ``"file"`` for plain paths, ``file://`` and ``local://``; ``"s3"`` for ``s3a://``
    #: too; else the scheme, lower-cased.
    protocol: str
    #: As :func:`split_url` returns it (absolute for local files).
    path: str

    @classmethod
    def of(cls, url: str | os.PathLike[str] | StorageURL, name: str = "url") -> StorageURL:
        """``url`` split (a :class:`StorageURL` is returned as it is). A NUL byte in it is
        a :class:`~ptestore.errors.ConfigurationError` naming the value (escaped), before
        anything opens it (the OS would raise a bare ``ValueError``); so is a value that
        is no path (None, bytes, a number: :func:`ptestore._args.path_argument`, naming
        the argument ``name``)."""
        if isinstance(url, StorageURL):
            return url
        if isinstance(url, str):
            text = url
        else:
            from .._args import path_argument

            text = path_argument(url, name)
        if "\x00" in text:  # the kernel takes none, a store's key neither: refused here
            from .._text import shown
            from ..errors import ConfigurationError

            raise ConfigurationError(
                f"{shown(text)}: contains a NUL byte ('\\x00', at character "
                f"{text.index(chr(0))}): no path or URL can hold one"
            )
        return cls(text, *split_url(text))

    @property
    def local(self) -> bool:
        """A local file (plain path, ``file://`` or ``local://``): it takes no storage
        options."""
        return self.protocol == "file"

    @property
    def location(self) -> str:
        """Where the object is, one spelling per object for keys and records: a local
        file's real path (symbolic links resolved), else the URL as given."""
        return os.path.realpath(self.path) if self.local else self.text


def local_path(url: str | os.PathLike[str] | StorageURL) -> str | None:
    """The absolute path of a local ``url`` (plain path, ``file://``, ``local://``), or
    None for a URL of any other scheme."""
    u = StorageURL.of(url)
    return u.path if u.local else None


def file_path(url: str | os.PathLike[str] | StorageURL) -> str | None:
    """The path the OS is given for a local ``url``: a plain path as it is given (a
    relative one stays relative, resolved against the current directory as
    :func:`split_url` resolves it), the path a ``file://`` or ``local://`` URL names
    (:attr:`StorageURL.path`); None for a URL of any other scheme. What code that opens,
    makes or renames local files itself (not through a loader or a writer) takes."""
    u = StorageURL.of(url)
    if not u.local:
        return None
    return u.text if _SCHEME.match(u.text) is None else u.path


def is_relative_local(url: str | os.PathLike[str]) -> bool:
    """A local path or ``file://``/``local://`` URL that is relative (to the current
    directory of whoever reads it)."""
    text = os.fspath(url)
    match = _SCHEME.match(text)
    if match is None:
        return not os.path.isabs(text)
    if _ALIASES.get(match.group(1).lower(), match.group(1).lower()) != "file":
        return False
    return not os.path.isabs(text[match.end() :])


def absolute_local(url: str | os.PathLike[str]) -> str:
    """``url`` with a relative local path made absolute (against the current
    directory); any other URL as given."""
    text = os.fspath(url)
    return split_url(text)[1] if is_relative_local(text) else text


#: What ``open_loader``, ``open_writer`` and the option routing take as a URL.
URLLike = str | os.PathLike[str] | StorageURL


def strerror(exc: OSError) -> str:
    """The system's text for an ``OSError`` (its ``strerror``, else its ``str``)."""
    return exc.strerror or str(exc)


# --- what a URL shows and what it names --------------------------------------------
#
# A URL may carry credentials (a user and password, a presigned query's signature):
# what ptestore shows or records of one is :func:`redacted_url`'s form, what it keys by
# :func:`url_identity`'s. Both live in :mod:`ptestore._redact` (the standard library
# only: the logger and the errors below the storage layer redact with them too) and are
# the storage layer's API from here.


def loader_url(loader: DataLoader) -> str:
    """The URL or path ``loader`` reads, credentials included (a remote loader's
    ``url``; a wrapper's ``inner`` loader's; else its ``name``): what a loader is
    compared by (is a destination its source?) and, through :func:`url_identity`, keyed
    by, where its ``name`` (redacted) would make two objects one. Never shown."""
    seen = 0
    while seen < 16:  # wrappers of wrappers, never a cycle
        url = getattr(loader, "url", None)
        if isinstance(url, str):
            return url
        inner = getattr(loader, "inner", None)
        if inner is None or not hasattr(inner, "load"):
            break
        loader, seen = inner, seen + 1
    return loader.name
