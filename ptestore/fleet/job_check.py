"""Whether a job's destinations are safe (and its CPU fingerprints well formed), checked
when the job is parsed (:mod:`.job`).

No two destinations may be one stored object, no destination may be one of the job's
sources, and every destination stays below the template's root and off the names the job
keeps for its own objects there: ``_shared/`` (each .ptd once, :mod:`.shared`), the index
(``ptestore-index.json`` and its version 3 shards ``ptestore-index.v3-<hex>/``,
:mod:`.index`), the preflight's marker (``.ptestore-preflight-<hex>``, :mod:`.preflight`)
and XNNPACK's packed-weight files and records beside the artifacts (``<stem>.xpwc.json``,
``<stem>.xnnpack-<id>.xpwc``, :mod:`.packed`).

Each check is one dictionary look-up per destination (sources by their identity, local
ones also by device and inode), so a job of many pairs loads in time linear in its pairs.
This module imports nothing of :mod:`.job` (which calls it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from ..coordinator.targets import target_identity
from ..storage.types import StorageURL

__all__ = [
    "INDEX_PREFIX",
    "PREFLIGHT_PREFIX",
    "SHARED_DIR",
    "XNNPACK_SUFFIXES",
    "destinations_problem",
    "fingerprint_problem",
    "names_problem",
    "template_root",
]

#: The directory under the template's root where a job stores each .ptd once, by
#: content (:mod:`ptestore.fleet.shared`); no destination may lie in it.
SHARED_DIR = "_shared"
#: How the index's names begin: ``ptestore-index.json``, ``ptestore-index.v3-<hex>/``.
INDEX_PREFIX = "ptestore-index"
#: How the preflight's marker is named (:data:`ptestore.fleet.preflight.MARKER_PREFIX`).
PREFLIGHT_PREFIX = ".ptestore-preflight-"
#: How XNNPACK's records and packed-weight files beside an artifact end.
XNNPACK_SUFFIXES = (".xpwc.json", ".xpwc")


def template_root(dest: str) -> str:
    """The template's fixed part up to its last separator before the first field."""
    prefix = dest[: dest.index("{")]
    cut = prefix.rfind("/")
    if StorageURL.of(dest).local:
        cut = max(cut, prefix.rfind(os.sep))
    return prefix[: cut + 1]


def _base(root: str) -> str:
    """``root`` as :func:`_segments_below` compares it: a normalized local directory
    with its separator, or an object key prefix with its slash ("" for any)."""
    if StorageURL.of(root or ".").local:
        return os.path.normpath(StorageURL.of(root or ".").path).rstrip(os.sep) + os.sep
    base_id = target_identity(root)[1] if root.partition("://")[2].strip("/") else ""
    return base_id.rstrip("/") + "/" if base_id else ""


def _segments_below(url: str, ident: tuple[str, str], base: str) -> list[str] | None:
    """The path segments of ``url`` (whose identity is ``ident``) below ``base``
    (:func:`_base`) once both are normalized the way the store will address them (dot
    segments resolved, separators folded); None when ``url`` is not below it."""
    u = StorageURL.of(url)
    if u.local:
        here = os.path.normpath(u.path)
        return here[len(base) :].split(os.sep) if here.startswith(base) else None
    here_id = ident[1]
    return here_id[len(base) :].split("/") if here_id.startswith(base) else None


def _inode(url: str) -> tuple[int, int] | None:
    """``(device, inode)`` of an existing local file (symbolic links followed)."""
    u = StorageURL.of(url)
    if not u.local:
        return None
    try:
        st = os.stat(u.path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _reserved(where: str, dst: str, root: str, segments: list[str]) -> str | None:
    """Why ``dst`` takes a name the job keeps for its own objects, or None."""
    shown_root = root or os.curdir + os.sep
    if segments[0] == SHARED_DIR:
        return (
            f"pair {where}'s destination {dst} is in {root}{SHARED_DIR}/, where the "
            "job stores each .ptd once by its content"
        )
    for seg in segments:
        if seg.startswith(INDEX_PREFIX):
            return (
                f"pair {where}'s destination {dst} has a name beginning {INDEX_PREFIX} "
                f"({seg!r}), which the job's index takes ({shown_root}{INDEX_PREFIX}.json "
                f"and its shards)"
            )
        if seg.startswith(PREFLIGHT_PREFIX):
            return (
                f"pair {where}'s destination {dst} has a name beginning {PREFLIGHT_PREFIX} "
                f"({seg!r}), which the preflight's marker takes"
            )
    for suffix in XNNPACK_SUFFIXES:
        if segments[-1].endswith(suffix):
            return (
                f"pair {where}'s destination {dst} ends with {suffix}, which names XNNPACK's "
                "packed-weight files and their records beside the artifacts"
            )
    return None


def destinations_problem(
    template: str,
    sources: Iterable[str],
    pairs: Iterable[tuple[str, tuple[str | None, ...], object]],
) -> str | None:
    """Why the destinations are unsafe, or None. ``pairs`` are ``(label, destinations,
    ...)`` (the label such as ``(model, device)``, a destination None when there is
    none; what follows is :func:`names_problem`'s)."""
    root = template_root(template)
    base = _base(root)
    by_identity: dict[tuple[str, str], str] = {}
    by_inode: dict[tuple[int, int], str] = {}
    for src in sources:
        by_identity.setdefault(target_identity(src), src)
        inode = _inode(src)
        if inode is not None:
            by_inode.setdefault(inode, src)
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for where, dsts, _ in pairs:
        for dst in dsts:
            if dst is None:
                continue
            ident = target_identity(dst)
            segments = _segments_below(dst, ident, base)
            if not segments or segments == [""]:
                return (
                    f"pair {where}'s destination {dst} is outside the template's root "
                    f"{root or os.curdir + os.sep}"
                )
            problem = _reserved(where, dst, root, segments)
            if problem:
                return problem
            found = by_identity.get(ident)
            if found is None and by_inode:
                inode = _inode(dst)
                found = by_inode.get(inode) if inode is not None else None
            if found is not None:
                return (
                    f"pair {where}'s destination {dst} is the source {found}: a destination "
                    "must never be one of the job's sources"
                )
            if ident in seen:
                other, other_dst = seen[ident]
                shown = dst if dst == other_dst else f"{other_dst} and {dst}"
                return f"pairs {other} and {where} share the destination {shown}"
            seen[ident] = (where, dst)
    return None


def name_problem(where: str, dsts: Iterable[str | None], xnnpack: bool) -> str | None:
    """Why a name the pair ``where`` writes is too long for its store, or None: a local
    file name over NAME_MAX (255 bytes), an S3 key over 1,024 bytes: its destinations
    and, when its device asks for XNNPACK's packed-weight file (``xnnpack``), that
    file's name beside its ``.pte`` (``<stem>.xnnpack-<32 hex>.xpwc``), which a run
    would otherwise fail to write after the pair's artifact was made."""
    from .holds import name_size

    for i, dst in enumerate(dsts):
        if dst is None:
            continue
        names = [(dst, f"destination {dst}")]
        if xnnpack and i == 0:  # as .packed.file_url names it (packed imports the job)
            packed = (dst[:-4] if dst.endswith(".pte") else dst) + f".xnnpack-{'0' * 32}.xpwc"
            shown = os.path.basename(packed).replace("0" * 32, "<32 hex>")
            names.append(
                (packed, f"XNNPACK packed-weight file (xnnpack_cpu) beside {dst}, {shown},")
            )
        for name, what in names:
            sized = name_size(name)
            if sized is not None and sized[0] > sized[1]:
                unit = "a file name" if StorageURL.of(name).local else "an S3 key"
                return (
                    f"pair {where}'s {what} would take {sized[0]} bytes, over the {sized[1]} "
                    f"{unit} may take: a shorter model or device name, or template, makes it fit"
                )
    return None


def names_problem(pairs: Iterable[tuple[str, tuple[str | None, ...], object]]) -> str | None:
    """The first :func:`name_problem` of ``pairs``: ``(label, destinations, its
    device's CPU fingerprint when it asks for XNNPACK's packed-weight file, else None)``;
    None when every name fits."""
    for where, dsts, cpu in pairs:
        problem = name_problem(where, dsts, cpu is not None)
        if problem:
            return problem
    return None


def fingerprint_problem(value: object) -> str | None:
    """Why ``value`` is not a CPU fingerprint as :func:`ptestore.xnnpack.cpu_fingerprint`
    writes it, or None."""
    if isinstance(value, str) and re.fullmatch(
        r"[A-Za-z0-9_.-]+/page=[1-9][0-9]*(/midr=0x[0-9a-f]{8,16})?:[a-z0-9_,]*", value
    ):
        return None
    return (
        f"{value!r}: must be the device's CPU fingerprint, as `python -m ptestore.xnnpack "
        "fingerprint` prints it on the device (e.g. 'aarch64/page=4096:asimd,asimddp,i8mm')"
    )
