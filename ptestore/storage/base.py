"""What every loader shares: ``with loader:`` closes it, the storage options a loader
class accepts are data on the class, and reads outside the object are refused with one
message. Imported by the local loaders (:mod:`.loaders`) and the remote one
(:mod:`.remote`), which do not import each other at start-up."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from ..errors import StorageError
from .types import StorageURL

__all__ = ["LoaderBase", "check_range"]

L = TypeVar("L", bound="LoaderBase")


class LoaderBase:
    """``with loader:`` closes it; the storage options a loader class accepts are data
    on the class (:attr:`options`, :meth:`accepted_options`), read by
    :func:`~ptestore.storage.loaders.loader_options` and the option routing
    (:mod:`ptestore.storage.routing`)."""

    #: Storage options the constructor path takes (``open_loader`` refuses all others).
    options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def accepted_options(cls, url: StorageURL) -> frozenset[str]:
        """Storage options that apply to this loader for ``url`` (default:
        :attr:`options`)."""
        return cls.options

    def close(self) -> None:
        """Release what the loader holds (nothing here; a file loader closes its file)."""

    def __enter__(self: L) -> L:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        from .._redact import redacted_url

        name = getattr(self, "name", None)
        return f"<{type(self).__name__} {redacted_url(str(name))}>" if name else super().__repr__()


def check_range(name: str, offset: int, size: int, total: int) -> None:
    """Refuse a read of ``size`` bytes at ``offset`` outside an object of ``total``."""
    if offset < 0 or size < 0 or offset + size > total:
        raise StorageError(
            f"{name}: read of {size} bytes at offset {offset} is outside the object (size {total})"
        )
