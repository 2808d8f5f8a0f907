"""The scheme table: which loader and which writer serve a URL, and what to install
when one needs a package that is missing.

One row per scheme (:data:`SCHEMES`), as fsspec's ``known_implementations`` registry
does it: the classes are named by ``"module:Class"`` strings and imported on first use,
so that consulting the table costs nothing and a local run never loads fsspec or s3fs.
:func:`~ptestore.storage.loaders.open_loader`, :func:`~ptestore.writers.open_writer` and
the option routing (:mod:`ptestore.storage.routing`) all ask :func:`scheme_of`; a row
whose package is missing raises one :class:`~ptestore.errors.ConfigurationError` with the
install hint (``pip install 'ptestore[s3]'``) before anything is imported or opened.

The storage layer sits below the writers: this module reaches a writer class only
through its string, imported lazily (:meth:`Scheme.writer_class`), never by an import
statement.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass
from ..errors import ConfigurationError
from .types import StorageURL, URLLike, redacted_url

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT",
    "SCHEMES",
    "Scheme",
    "loader_options",
    "scheme_of",
    "writer_options",
]


@dataclass(frozen=True)
class Scheme:
    """One row of the table: what reads and writes URLs of one protocol."""

    #: The protocol, as :attr:`StorageURL.protocol` gives it (``"file"``, ``"s3"``, ...).
    protocol: str
    #: ``"module:Class"`` of the loader.
    loader: str
    #: ``"module:Class"`` of the writer.
    writer: str
    #: What the options apply to, in messages (``"local files"``, ``"s3://"``).
    applies_to: str
    #: Top-level modules the row needs beyond ptestore's own dependencies.
    requires: tuple[str, ...] = ()
    #: The ptestore extra that installs them (``"s3"``: ``pip install 'ptestore[s3]'``).
    extra: str | None = None
    #: What the writer's options apply to, when it says more than :attr:`applies_to`.
    writer_applies_to: str | None = None

    def install_hint(self) -> str:
        """How to install what the row needs."""
        if self.extra is not None:
            return f"pip install 'ptestore[{self.extra}]'"
        return "pip install " + " ".join(self.requires)

    def check_installed(self, url: StorageURL) -> None:
        """Raise :class:`ConfigurationError` naming the URL, the missing module and the
        install hint when a module the row needs cannot be imported."""
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a parent package missing, or None in sys.modules
                found = False
            if not found:
                raise ConfigurationError(
                    f"{redacted_url(url.text)}: {self.protocol}:// needs the {module} package, "
                    f"which is not installed: {self.install_hint()}"
                )

    def target(self, url: StorageURL) -> str:
        """What the row's classes are constructed with: the path of a local file, else
        the URL as given."""
        return url.path if url.local else url.text

    def loader_class(self, url: StorageURL) -> Any:
        """The loader class (imported now; see :meth:`check_installed`)."""
        self.check_installed(url)
        return _import(self.loader)

    def writer_class(self, url: StorageURL) -> Any:
        """The writer class (imported now; see :meth:`check_installed`)."""
        self.check_installed(url)
        return _import(self.writer)


def _import(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


_FSSPEC_LOADER = "ptestore.storage.remote:FsspecLoader"

#: The rows, by protocol (aliases such as ``local://`` and ``s3a://`` are folded by
#: :func:`~ptestore.storage.types.split_url` before the table is asked).
SCHEMES: Mapping[str, Scheme] = {
    s.protocol: s
    for s in (
        Scheme(
            "file",
            "ptestore.storage.loaders:LocalFileLoader",
            "ptestore.writers.local:LocalFileWriter",
            "local files",
        ),
        Scheme("memory", _FSSPEC_LOADER, "ptestore.writers.memory:MemoryWriter", "memory://"),
        Scheme(
            "s3",
            _FSSPEC_LOADER,
            "ptestore.writers.s3:S3Writer",
            "s3://",
            requires=("s3fs",),
            extra="s3",
        ),
    )
}

#: Any other protocol: through fsspec; the package it needs is the one fsspec's own
#: registry (``known_implementations``) names for the protocol (``gs`` -> ``gcsfs``).
DEFAULT = Scheme("*", _FSSPEC_LOADER, "ptestore.writers.generic:FsspecWriter", "fsspec")


def scheme_of(url: URLLike) -> Scheme:
    """The row that serves ``url``."""
    u = StorageURL.of(url)
    row = SCHEMES.get(u.protocol)
    if row is not None:
        return row
    return Scheme(
        u.protocol,
        DEFAULT.loader,
        DEFAULT.writer,
        f"{u.protocol}://",
        requires=_fsspec_requirement(u.protocol),
        writer_applies_to=f"{u.protocol}:// (FsspecWriter)",
    )


def _fsspec_requirement(protocol: str) -> tuple[str, ...]:
    """The package fsspec's own registry names for ``protocol`` (``gs`` -> ``gcsfs``),
    unless it is fsspec itself or registered at run time; () for a protocol fsspec does
    not know (its loader then says so)."""
    from fsspec.registry import known_implementations, registry

    impl = known_implementations.get(protocol)
    if protocol in registry or impl is None:
        return ()
    top = str(impl.get("class", "")).split(".")[0]
    return () if top in ("", "fsspec") else (top,)


def loader_options(url: URLLike) -> frozenset[str]:
    """The names of the storage options :func:`~ptestore.storage.loaders.open_loader`
    accepts for ``url``."""
    u = StorageURL.of(url)
    names: frozenset[str] = scheme_of(u).loader_class(u).accepted_options(u)
    return names


def writer_options(url: URLLike) -> frozenset[str]:
    """The names of the storage options :func:`~ptestore.writers.open_writer` accepts
    for ``url`` (the writer class is imported through the table, lazily)."""
    u = StorageURL.of(url)
    row = scheme_of(u)
    names: frozenset[str] = row.writer_class(u).accepted_options(row.target(u))
    return names
