"""Store once what every device shares: a fleet job's .ptd files under the address of
their bytes.

A backend that leaves a model's external weights alone makes the same .ptd for every
device (only the .pte's delegate data differs), so a job stores each distinct .ptd once::

    <root>/_shared/sha256-tree/<hex>.ptd

``<root>`` is the destination template's fixed part up to its last ``/`` before the
first field (where the index lives too: ``s3://models/{device}/{model}.pte`` ->
``s3://models/_shared/sha256-tree/<hex>.ptd``), and ``<hex>`` the digest of the
object's bytes, named by its algorithm: ``sha256-tree`` (the root of its chunk digests,
:mod:`ptestore.provenance.chunks`; what ptestore names bytes by since provenance
version 3) or ``sha256`` (the whole-file SHA-256, stored by older versions; still
found and checked). A shared .ptd has no provenance trailer (its bytes are exactly the
container, so its name is the digest of the whole object); the .pte's record binds it
by that digest (``ptd_output``: size, digest, CRC-32), never by its URL.

A name is never trusted alone: an object found at a content address is used only
when its size is the recorded one and its bytes are the recorded ones, checked like
every destination (:mod:`.binding`): the checksum S3 keeps, else a full read
and the digest (remembered per object version in this process, so a plan of many
pairs reads it once; a local object's version is its size, mtime, ctime, inode and
device). Publishing is ``mode="create"`` (S3 ``If-None-Match: *``, an
exclusive link on local disks): two workers storing one address at once both succeed,
the second accepting what the first stored once its bytes check. An object whose
bytes do not check (damaged) is stored again over it.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._log import get_logger
from ..coordinator.targets import target_identity
from ..errors import FormatError, ObjectNotFound
from ..provenance.chunks import well_formed
from ..provenance.digest import content_digest
from ..storage.types import StorageURL, loader_url, url_identity
from ..writers import open_writer
from .binding import content_verdict
from .job import SHARED_DIR, pair_options, template_root

if TYPE_CHECKING:
    from ..provenance.record import ContentDigest, Provenance
    from ..storage.types import DataLoader
    from ..writers.base import DataWriter, PublishMode

__all__ = [
    "SHARED_DIR",
    "SharedStore",
    "check_shared",
    "check_shared_ptd",
    "is_shared_url",
    "locate_shared",
    "shared_digest",
    "shared_root",
    "shared_url",
]

_NAME = re.compile(r"(^|/)" + SHARED_DIR + r"/(sha256|sha256-tree)/([0-9a-f]{64})\.ptd$")

log = get_logger("ptestore.fleet")

#: ``(object, version) -> sha256`` of objects this process read in full and checked.
_CHECKED: dict[tuple[str, Any], str] = {}
_LOCK = threading.Lock()


def shared_root(destination: str) -> str:
    """Where a job with the destination template ``destination`` stores shared
    objects: ``<root>/_shared/``."""
    return template_root(destination) + SHARED_DIR + "/"


def shared_url(root: str, sha256: str) -> str:
    """The content address under ``root`` (``.../_shared/``) of bytes with the digest
    ``sha256`` (``sha256-tree:<hex>`` or ``sha256:<hex>``):
    ``<root><algorithm>/<hex>.ptd``."""
    if not well_formed(sha256):
        raise FormatError(
            root,
            "ptd_output.sha256",
            sha256,
            "sha256-tree:<64 lowercase hex digits> (or sha256:<...>)",
        )
    algorithm, _, hexd = sha256.partition(":")
    return f"{root}{algorithm}/{hexd}.ptd"


def is_shared_url(url: str) -> bool:
    """Whether ``url`` names a content address (``.../_shared/sha256-tree/<hex>.ptd``)."""
    return _NAME.search(url.replace(os.sep, "/")) is not None


def shared_digest(url: str) -> str | None:
    """The digest a content address names (``sha256-tree:<hex>``), None for another URL."""
    m = _NAME.search(url.replace(os.sep, "/"))
    return None if m is None else f"{m.group(2)}:{m.group(3)}"


def _version(loader: DataLoader) -> Any:
    """What pins the object's bytes: its ETag, or (local files) size, mtime, ctime,
    inode and device (the ctime too: a byte changed in place with the mtime set back
    changes it; no call sets it back)."""
    etag = getattr(loader, "etag", None)
    if isinstance(etag, str):
        return etag
    path = getattr(loader, "path", None)
    if StorageURL.of(loader.name).local and isinstance(path, str):
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    return None


def check_shared(loader: DataLoader, content: ContentDigest) -> str | None:
    """Why the object behind ``loader`` is not the content-addressed ``content``
    (size, then the checksum S3 keeps or the SHA-256), or None when it is."""
    size = loader.size()
    if size != content.size:
        return f"{loader.name} has {size} bytes, the record names {content.size}"
    verdict = content_verdict(loader, content)
    if verdict.trusted is not None:
        return None if verdict.trusted else verdict.reason
    version = _version(loader)
    key = (url_identity(loader_url(loader)), version)  # the object, not its shown name
    with _LOCK:  # one full read per object version, however many pairs ask at once
        got = _CHECKED.get(key) if version is not None else None
        if got is None:
            got = content_digest(loader, size, like=content.sha256).sha256
            if version is not None:
                _CHECKED[key] = got
    if got != content.sha256:
        return (
            f"{loader.name}: the bytes have {got}, the record names {content.sha256}: "
            "damaged or changed after they were stored"
        )
    return None


def _open(url: str, options: dict[str, Any]) -> DataLoader:
    from ..storage.loaders import open_loader
    from ..storage.routing import options_for_loader

    return open_loader(url, **options_for_loader(url, options))


def locate_shared(url: str, sha256: str, exists: Any) -> str | None:
    """The content address of ``sha256`` in the nearest directory above the artifact
    at ``url`` that has one (``exists(candidate)`` says), or None. A job's shared
    objects are under its root, an ancestor of every destination."""
    u = StorageURL.of(url)
    if u.local:
        here = os.path.dirname(u.path)
        while True:
            candidate = os.path.join(here, SHARED_DIR, "")
            found = shared_url(candidate, sha256)
            if exists(found):
                return found
            up = os.path.dirname(here)
            if up == here:
                return None
            here = up
    scheme, sep, rest = url.partition("://")
    parts = rest.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        candidate = scheme + sep + "/".join(parts[:depth]) + f"/{SHARED_DIR}/"
        found = shared_url(candidate, sha256)
        if exists(found):
            return found
    return None


def check_shared_ptd(
    pte: str, prov: Provenance, open_: Callable[[str], DataLoader], root: str
) -> tuple[bool, str]:
    """``(current, reason)`` of the .ptd the .pte at ``pte`` (record ``prov``) was made
    with, stored under ``root`` by content."""
    if prov.ptd_output is None:
        return False, f"{pte} was made without a .ptd"
    try:
        url = shared_url(root, prov.ptd_output.sha256)
    except FormatError as exc:
        return False, f"damaged provenance trailer: {exc}"
    try:
        loader = open_(url)
    except ObjectNotFound:
        return False, f"no .ptd at {url} (the one {pte} was made with)"
    try:
        bad = check_shared(loader, prov.ptd_output)
    finally:
        loader.close()
    if bad is not None:
        return False, bad
    return True, "current: provenance and bytes match"


class SharedStore:
    """The job's content-addressed store (a
    :class:`~ptestore.coordinator.output.ContentStore`): ``find`` checks an object at
    an address, ``writer`` opens one to store it; ``open_`` opens a loader (the fleet
    counts the bytes it reads). An object ``find`` finds among ``hold_shared`` (the
    identities of those no live index entry named when the run started, :mod:`.reuse`;
    None: any) is held before it is relied on (:mod:`.holds`)."""

    def __init__(
        self,
        root: str,
        options: dict[str, Any],
        open_: Callable[[str], DataLoader] | None = None,
        hold_shared: frozenset[tuple[str, str]] | None = None,
    ) -> None:
        self.root = root
        self.options = options
        self.open = open_ or (lambda url: _open(url, options))
        self.hold_shared = hold_shared
        #: Content addresses found holding other bytes (damaged): why, by URL.
        self.damaged: dict[str, str] = {}

    def url(self, content: ContentDigest) -> str:
        return shared_url(self.root, content.sha256)

    def find(self, content: ContentDigest) -> str | None:
        url = self.url(content)
        try:
            loader = self.open(url)
        except ObjectNotFound:
            return None
        try:
            bad = check_shared(loader, content)
        finally:
            loader.close()
        if bad is not None:
            log.warning("%s: damaged, stored again: %s", url, bad)
            self.damaged[url] = bad
            return None
        if self.hold_shared is not None and target_identity(url) not in self.hold_shared:
            return url  # named by an index, or stored since the run started: kept by gc
        # Reused, not stored again, old and unreferenced: held against gc until the
        # run's index names it; one gone meanwhile is stored again.
        from .holds import hold

        return None if hold([url], self.options) else url

    def writer(self, content: ContentDigest) -> DataWriter:
        url = self.url(content)
        return open_writer(url, **pair_options(url, self.options).for_writer(url))

    def publish_mode(self, content: ContentDigest) -> PublishMode:
        """``"create"``, or ``"overwrite"`` over an object :meth:`find` found damaged
        (every writer of an address writes the same bytes)."""
        return "overwrite" if self.url(content) in self.damaged else "create"
