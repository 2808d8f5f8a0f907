"""The DataWriter contract: staged writes at any offset, then one atomic publish."""

from __future__ import annotations

import abc
from typing import Literal

from ..loaders import DataLoader

__all__ = ["DataWriter", "PublishMode"]

PublishMode = Literal["overwrite", "create"]


class DataWriter(abc.ABC):
    """A transactional output object.

    Life cycle: OPEN -> PUBLISHED or DISCARDED (both terminal).

    - :meth:`write` copies bytes into the unpublished output at any offset, in any
      order; overlapping writes are allowed (the later one wins); gaps read as zeros.
      The published object is ``[0, max end)``.
    - :meth:`copy_from` is equivalent to ``write(loader.load(src_offset, size),
      dst_offset)`` but may avoid moving the bytes through Python.
    - :meth:`publish` makes the output visible atomically; ``mode="create"`` refuses to
      replace an existing object (:class:`~ptestore.errors.AlreadyExists`).
    - :meth:`discard` is idempotent and removes everything staged. Leaving a ``with``
      block without publishing, garbage collection and interpreter exit discard;
      nothing ever publishes implicitly.
    """

    #: The destination path or URL, used in messages.
    url: str

    @abc.abstractmethod
    def write(self, data: bytes | bytearray | memoryview, offset: int) -> None: ...

    def copy_from(self, loader: DataLoader, src_offset: int, size: int, dst_offset: int) -> None:
        """Copy ``size`` bytes of ``loader`` at ``src_offset`` to ``dst_offset``."""
        chunk = 8 << 20
        done = 0
        while done < size:
            n = min(chunk, size - done)
            self.write(loader.load(src_offset + done, n), dst_offset + done)
            done += n

    @abc.abstractmethod
    def publish(self, mode: PublishMode = "overwrite") -> None: ...

    @abc.abstractmethod
    def discard(self) -> None: ...

    def __enter__(self) -> DataWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()
