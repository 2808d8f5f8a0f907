"""The integrity step of :func:`ptestore.verify`: one file's structure, provenance
trailer, record and bytes (:func:`read_checked`), and the ``.ptd`` of a ``.pte``: beside
it, at a fleet's content address above it, with or without a trailer
(:func:`check_ptd`, :func:`check_content_address`). Each adds its findings to the
report it is given; a corrupt file raises :class:`~ptestore.errors.FormatError`."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

from .errors import FormatError, ObjectNotFound
from .format.reader import read_container
from .provenance import Provenance, read_trailer
from .provenance.digest import content_digest
from .provenance.trailer import ContentView, Trailer
from .storage.loaders import open_loader

if TYPE_CHECKING:
    from .provenance.record import ContentDigest
    from .storage.routing import StorageOptions

__all__ = ["Findings", "check_content_address", "check_ptd", "is_plain", "read_checked"]


class Findings(Protocol):
    """What these checks write to (``ptestore.verification.VerifyReport``)."""

    content_checked: bool
    ptd: str | None
    ptd_size_only: bool

    def stale(self, field_name: str, message: str) -> None: ...


def read_checked(
    report: Findings, target: str, opts: StorageOptions, quick: bool
) -> tuple[Provenance, Trailer]:
    """Structure, trailer, record and (unless ``quick``) the bytes of one file."""
    loader = open_loader(target, **opts.for_loader(target, "dst"))
    try:
        trailer = read_trailer(loader)
        content = loader if trailer is None else ContentView(loader, trailer.content_size)
        read_container(content)  # structure: headers, FlatBuffer, segment bounds
        if trailer is None:
            raise FormatError(
                target, "provenance trailer", None, "present (an artifact made with provenance)"
            )
        prov = Provenance.of_trailer(trailer, target)  # also with quick: nothing read yet
        if prov.content is None:
            report.stale(
                "content.sha256",
                "the record names no digest of the bytes it follows (made by an older "
                "ptestore): nothing binds it to this file; specialize it again",
            )
        elif not quick:
            got = content_digest(loader, trailer.content_size, like=prov.content.sha256)
            if got.size != prov.content.size or got.sha256 != prov.content.sha256:
                loader.check_unchanged()  # replaced while it was read: not damage
                raise FormatError(
                    target,
                    "content.sha256",
                    got.sha256,
                    f"{prov.content.sha256}, the digest of the {prov.content.size} bytes "
                    "before the trailer recorded in the provenance",
                    "the artifact was damaged or changed after it was made",
                )
            report.content_checked = True
    finally:
        loader.close()
    return prov, trailer


def check_ptd(
    report: Findings,
    prov: Provenance,
    target: str,
    ptd: str | os.PathLike[str] | None,
    opts: StorageOptions,
    quick: bool,
) -> None:
    """The .ptd beside a .pte (or, when there is none, the one a fleet stored once by
    its content in a ``_shared/`` directory above it) must be the one it was
    made with."""
    from .fleet.job import ptd_beside
    from .fleet.shared import is_shared_url, locate_shared

    url = ptd_beside(target) if ptd is None else os.fspath(ptd)
    if ptd is None and prov.ptd_output is not None:
        # a .ptd beside it that is not its own (one an earlier version wrote per device
        # beside a fleet's .pte) does not hide the copy stored by content above it
        shared = locate_shared(target, prov.ptd_output.sha256, lambda u: _exists(u, opts))
        if shared is not None and not _holds(url, prov.ptd_output, opts, quick):
            url = shared
    report.ptd = url
    if prov.ptd_output is None:
        report.stale("ptd_output", f"the .pte was made without a .ptd, but {url} was given with it")
        return
    if is_shared_url(url) or is_plain(url, opts):
        _check_plain_ptd(report, prov, url, opts, quick)
        return
    try:
        ptd_prov, _ = read_checked(report, url, opts, quick)
    except ObjectNotFound:
        report.stale("ptd_output", f"the .pte was made with a .ptd, and there is none at {url}")
        return
    if ptd_prov.role != "ptd":
        report.stale("ptd_output", f"{url} is a {ptd_prov.role} artifact, not a .ptd")
        return
    if ptd_prov.content != prov.ptd_output:
        have = "nothing" if ptd_prov.content is None else ptd_prov.content.sha256
        report.stale(
            "ptd_output.sha256",
            f"{url} holds {have}, not the .ptd this .pte was made with "
            f"({prov.ptd_output.sha256}): it belongs to another pair or device",
        )
    diff = ptd_prov.key().mismatches(prov.key())
    if diff:
        report.stale("ptd_output.key", f"{url} was made for another pair: {'; '.join(diff)}")


def _exists(url: str, opts: StorageOptions) -> bool:
    try:
        open_loader(url, **opts.for_loader(url, "dst")).close()
    except ObjectNotFound:
        return False
    return True


def _holds(url: str, want: ContentDigest, opts: StorageOptions, quick: bool) -> bool:
    """Whether the .ptd at ``url`` is ``want``: what its trailer names, or (without a
    trailer) its size and, unless ``quick``, the digest of its bytes; False when there
    is none."""
    try:
        loader = open_loader(url, **opts.for_loader(url, "dst"))
    except ObjectNotFound:
        return False
    try:
        trailer = read_trailer(loader)
        if trailer is not None:
            return Provenance.of_trailer(trailer, url).content == want
        size = loader.size()
        if size != want.size:
            return False
        return quick or content_digest(loader, size, like=want.sha256).sha256 == want.sha256
    finally:
        loader.close()


def is_plain(url: str, opts: StorageOptions) -> bool:
    """Whether the .ptd at ``url`` has no trailer (a shared .ptd as a fleet stores it
    and fetch downloads it); False when there is none."""
    try:
        loader = open_loader(url, **opts.for_loader(url, "dst"))
    except ObjectNotFound:
        return False
    try:
        return read_trailer(loader) is None
    finally:
        loader.close()


def _check_plain_ptd(
    report: Findings, prov: Provenance, url: str, opts: StorageOptions, quick: bool
) -> None:
    """A .ptd without a trailer (stored once by content, named by the SHA-256 of its
    bytes, or fetched from there): its name (at a content address), size and (unless
    ``quick``) bytes are the ``ptd_output`` of the .pte. Elsewhere other bytes are
    another pair's .ptd (stale); at a content address they are damage."""
    from .fleet.shared import shared_digest

    want = prov.ptd_output
    assert want is not None
    named = shared_digest(url)
    if named is not None and named != want.sha256:
        report.stale(
            "ptd_output.sha256",
            f"{url} is the content address of another .ptd, not of {want.sha256}, the one "
            "this .pte was made with",
        )
        return
    try:
        loader = open_loader(url, **opts.for_loader(url, "dst"))
    except ObjectNotFound:
        report.stale("ptd_output", f"the .pte was made with a .ptd, and there is none at {url}")
        return
    try:
        read_container(loader)  # structure: headers, FlatBuffer, segment bounds
        size = loader.size()
        if size != want.size and named is None:
            report.stale(
                "ptd_output.sha256",
                f"{url} holds {size} bytes, not the {want.size} of the .ptd this .pte was "
                f"made with ({want.sha256}): it belongs to another pair or device",
            )
            return
        if size != want.size:
            raise FormatError(url, "size", size, f"{want.size} (ptd_output.size of the .pte)")
        if quick:
            report.ptd_size_only = True
            return
        got = content_digest(loader, size, like=want.sha256)
        if got.sha256 != want.sha256:
            loader.check_unchanged()  # replaced while it was read: not another .ptd
            if named is None:
                report.stale(
                    "ptd_output.sha256",
                    f"{url} holds {got.sha256}, not the .ptd this .pte was made with "
                    f"({want.sha256}): it belongs to another pair or device",
                )
                return
            raise FormatError(
                url,
                "ptd_output.sha256",
                got.sha256,
                f"{want.sha256}, the .ptd this .pte was made with",
                "the .ptd was damaged or changed after it was stored",
            )
    finally:
        loader.close()


def check_content_address(report: Findings, url: str, opts: StorageOptions, quick: bool) -> None:
    """A .ptd a fleet stored once by content: it parses and (unless ``quick``) its
    bytes have the SHA-256 its name says. It has no record: it is at most intact (the
    .pte files that use it are verified with it)."""
    loader = open_loader(url, **opts.for_loader(url, "dst"))
    try:
        read_container(loader)
        if not quick:
            from .fleet.shared import shared_digest

            want = shared_digest(url)
            assert want is not None  # only called for a content address
            got = content_digest(loader, loader.size(), like=want).sha256
            if got != want:
                raise FormatError(
                    url,
                    "sha256",
                    got,
                    f"{want}, its content address",
                    "the shared .ptd was damaged or changed after it was stored",
                )
            report.content_checked = True
    finally:
        loader.close()
