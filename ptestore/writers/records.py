"""What a writer promises and returns: publish modes, guarantees, states, results,
versioned reads, and the wording of the two refusals every writer shares.

:mod:`.base` (the :class:`~ptestore.writers.base.DataWriter` life cycle) imports these and
re-exports them, so ``from ptestore.writers.base import PublishResult`` keeps working.
"""

from __future__ import annotations

import enum
from typing import Literal

from .._dataclass import dataclass
from ..errors import AlreadyExists, PreconditionFailed

__all__ = [
    "PublishMode",
    "PublishResult",
    "Versioned",
    "WriterGuarantees",
    "WriterState",
    "already_exists",
    "version_conflict",
]

#: ``"overwrite"`` replaces whatever is there, ``"create"`` refuses to replace anything
#: (:class:`~ptestore.errors.AlreadyExists`), ``"if-match"`` replaces only the version
#: read (``publish("if-match", expected=VERSION)``, else
#: :class:`~ptestore.errors.PreconditionFailed`).
PublishMode = Literal["overwrite", "create", "if-match"]


@dataclass(frozen=True)
class WriterGuarantees:
    """What a writer class promises, as data (docs/storage.md states the same table).

    The contract suite (:mod:`ptestore.testing.writer_contract`) reads these from the
    writer and runs the race tests only for what is promised.
    """

    #: Readers see the previous object or the complete new one, never a prefix or mix.
    atomic_publish: bool
    #: ``publish(mode="create")`` never replaces an object, even between concurrent
    #: publishers (enforced by the storage, not by a check-then-write).
    exclusive_create: bool
    #: Once ``publish`` returns, the object survives a crash or power loss (with the
    #: writer's default options).
    durable: bool
    #: Nothing is visible under the destination before ``publish``.
    isolated: bool = True
    #: After publishing, the stored object's size and checksum are checked.
    verified: bool = False
    #: ``publish(mode="if-match", expected=V)`` replaces the object only while it is
    #: still version ``V``, even between concurrent publishers (compare-and-swap).
    conditional_update: bool = False


class WriterState(enum.Enum):
    """Life cycle of a :class:`DataWriter`: ``OPEN`` then one terminal state."""

    OPEN = "open"
    PUBLISHED = "published"
    DISCARDED = "discarded"


@dataclass(frozen=True)
class PublishResult:
    """What :meth:`DataWriter.publish` made visible."""

    #: The destination path or URL.
    url: str
    #: Size of the published object in bytes.
    size: int
    #: Entity tag reported by the storage, if any (S3: the object's ETag).
    etag: str | None = None
    #: Version id reported by the storage, if any (S3 versioned buckets).
    version_id: str | None = None
    #: End-to-end checksum verified after publishing, as ``"<algorithm>:<value>"``
    #: (S3: ``"crc32:<base64>"``), or ``None`` when the writer does not check one.
    checksum: str | None = None


@dataclass(frozen=True)
class Versioned:
    """An object's bytes and the version token they were read at (None: no object), as
    :func:`~ptestore.writers.versions.read_versioned` returns them. Publish the changed
    bytes with ``publish("if-match", expected=version)``, or ``publish("create")`` when
    ``version`` is None."""

    data: bytes
    version: str | None
    #: The object's size when a read with ``max_bytes`` found it larger: ``data`` then
    #: holds none of it (``version`` is still the whole object's token); None otherwise.
    oversize: int | None = None

    @property
    def mode(self) -> PublishMode:
        """The publish mode that replaces exactly this version: ``"if-match"``, or
        ``"create"`` for no object."""
        return "create" if self.version is None else "if-match"


def already_exists(where: str, what: str = "object") -> AlreadyExists:
    """The error of a ``publish(mode="create")`` that found ``where`` taken, worded once
    for every writer."""
    return AlreadyExists(
        f"{where}: already exists; publish(mode='create') never replaces an existing {what}"
    )


def version_conflict(
    where: str,
    expected: str,
    found: str | None,
    refused_by: str = "ptestore",
    reason: str | None = None,
) -> PreconditionFailed:
    """The error of a ``publish(mode="if-match", expected=...)`` that found another
    version (``found``; None: no object), worded once for every writer; ``reason`` says
    why when the version found is the one expected (S3's 409 on a concurrent write)."""
    now = f"found version {found}" if found is not None else "found no object there"
    if reason:
        now += f" ({reason})"
    return PreconditionFailed(
        f"{where}: publish(mode='if-match') expected version {expected}, {now}; nothing "
        "was published (read it again, redo the change and retry)",
        url=where,
        expected=expected,
        found=found,
        refused_by=refused_by,
    )
