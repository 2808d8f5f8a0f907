"""Destination collisions: no destination may be a source or the other destination.

Checked before any work. Local paths are compared after resolving symlinks (and, when
both exist, as one inode, so hard links count too); URLs after normalizing the scheme
(``s3a`` is ``s3``, ``file://`` is a local path), backslashes, repeated, leading or
trailing slashes and dot segments: every rewrite a supported store is known to make
(:func:`object_key_identity`).
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from ..storage.types import StorageURL, URLLike, redacted_url

if TYPE_CHECKING:
    from ..writers.base import DataWriter

__all__ = [
    "check_pair_targets",
    "check_targets",
    "object_key_identity",
    "same_target",
    "target_identity",
]

_SLASHES = re.compile(r"/{2,}")


def target_identity(url: URLLike) -> tuple[str, str]:
    """``(protocol, normalized path)``: equal for two spellings of one object."""
    u = StorageURL.of(url)
    protocol, path = u.protocol, u.path
    if u.local:
        return "file", u.location
    if protocol == "memory":
        return "memory", "/" + object_key_identity(path)
    if protocol != "s3":  # other fsspec URLs: split_url keeps the whole URL
        path = path.partition("://")[2]
    return protocol, object_key_identity(path)


def object_key_identity(path: str) -> str:
    """``bucket/key`` as the most rewriting object store would address it.

    AWS and moto store a key literally, but SeaweedFS stores ``p\\m`` as ``p/m``, ``a//b``
    as ``a/b`` and ``/k`` as ``k`` (and refuses ``.`` and ``..`` segments): two spellings
    that one store folds into one object are one target for every store, so a
    destination can never alias a source on any of them."""
    key = _SLASHES.sub("/", path.replace("\\", "/")).strip("/")
    if not key:
        return key
    return posixpath.normpath("/" + key).lstrip("/")


def same_target(a: URLLike, b: URLLike) -> bool:
    """Whether URLs or paths ``a`` and ``b`` name the same stored object."""
    ua, ub = StorageURL.of(a), StorageURL.of(b)
    ia, ib = target_identity(ua), target_identity(ub)
    if ia == ib:
        return True
    if ua.local and ub.local:
        try:
            return os.path.samefile(ia[1], ib[1])
        except OSError:
            return False
    return False


_IN_PLACE = (
    "in-place specialization of a .pte/.ptd pair is refused ({s} -> {d}): the two files "
    "cannot be published in one atomic step; write the pair to new names"
)


def check_targets(pte: tuple[URLLike, URLLike], ptd: tuple[URLLike, URLLike] | None) -> None:
    """Refuse a .pte/.ptd pair where a destination is a source or the other destination
    (``pte`` and ``ptd`` are ``(source, destination)``, paths, URLs or URLs split
    already). A single .pte may be specialized in place."""
    if ptd is None:
        return
    (src, dst), (src_ptd, dst_ptd) = [(StorageURL.of(s), StorageURL.of(d)) for s, d in (pte, ptd)]
    for s, d in ((src, dst), (src_ptd, dst_ptd)):
        if _named(s.text) and same_target(s, d):
            raise ConfigurationError(
                _IN_PLACE.format(s=redacted_url(s.text), d=redacted_url(d.text))
            )
    pairs = [
        ("the destination .pte", dst, "the source .ptd", src_ptd, "would replace the .ptd"),
        ("the destination .ptd", dst_ptd, "the source .pte", src, "would replace the .pte"),
        (
            "the destination .ptd",
            dst_ptd,
            "the destination .pte",
            dst,
            "the .pte would be published over the new .ptd",
        ),
        ("the source .ptd", src_ptd, "the source .pte", src, "a .pte is not its own .ptd"),
    ]
    for what_a, a, what_b, b, why in pairs:
        if _named(a.text) and _named(b.text) and same_target(a, b):
            ta, tb = redacted_url(a.text), redacted_url(b.text)  # compared whole, shown redacted
            shown = ta if ta == tb else f"{ta} ({tb})"
            raise ConfigurationError(
                f"{what_a} and {what_b} are the same file, {shown}: {why}; every "
                "destination must differ from both sources and from the other destination"
            )


def _named(name: str) -> bool:
    """Loaders without a location are named ``<...>`` (e.g. ``<bytes>``)."""
    return not name.startswith("<")


def check_pair_targets(
    pte_source: str, pte_writer: DataWriter, ptd_source: str, ptd_writer: DataWriter
) -> None:
    """:func:`check_targets` for loaders and writers given directly."""
    if pte_writer is ptd_writer:
        raise ConfigurationError(
            f"pte_writer and ptd_writer are one writer ({redacted_url(pte_writer.url)}): the .pte "
            "would be published over the new .ptd; give each file its own writer"
        )
    check_targets((pte_source, pte_writer.url), (ptd_source, ptd_writer.url))
