"""Where ``fetch URL --xnnpack-cache`` (an artifact fetched by its URL, no index) takes
its packed-weight file from: the XNNPACK record beside the artifact (:mod:`.packed`),
read from the store as an index is and held to the same rules (docs/fleet.md, "What an
index may name"), its field's form and its ``url`` checked before anything it names is
requested; and what the error of a delivery that failed says became of the file: none,
or the one installed earlier for the artifact, kept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import PteStoreError

__all__ = ["kept_file", "not_delivered", "record_for"]


def record_for(
    record: dict[str, Any] | None,
    where: str,
    pte: dict[str, Any],
    ptd: dict[str, Any] | None,
    cpu: str,
    trusted_origins: Sequence[str] | None,
) -> dict[str, Any] | None:
    """``record``, the record read at ``where`` beside an artifact fetched by its URL
    (``pte`` and ``ptd`` as fetched), when it is bound to these bytes and names a
    file for ``cpu`` (the file's own identity, the whole files' SHA-256, is checked
    again when it is installed), its field checked as an index's
    (:func:`.packed_field.check_field`) and its ``url`` as a URL an index at ``where``
    names (:func:`.index_bounds.check_named_url`: from a store, never a local path or
    another service; from a server, only its own origin or a trusted one); None when
    there is none for them. A :class:`FormatError` naming the record, the field and
    the value when it breaks them, before anything it names is requested."""
    from .index_bounds import check_named_url
    from .index_bounds import trusted_origins as origins_of
    from .packed_field import check_field

    ptd_sha256 = None if ptd is None else ptd["sha256"]
    if (
        record is None
        or (record.get("pte") or {}).get("sha256") != pte["sha256"]
        or record.get("ptd_sha256") != ptd_sha256
        or record["xnnpack"].get("cpu") != cpu
    ):
        return None
    field = check_field(record["xnnpack"], where, "record")
    trusted = origins_of(trusted_origins)
    check_named_url(field["url"], where, "record xnnpack.url", trusted, reader="record")
    return {**record, "xnnpack": field}


def kept_file(pte: dict[str, Any], ptd: dict[str, Any] | None, directory: str) -> str | None:
    """The packed-weight file for the fetched artifact installed in ``directory`` before
    (a delivery that fails removes none: :func:`~ptestore.xnnpack.users.release` runs
    once one is installed), when one is there and passes its checks; else None."""
    from ..xnnpack import find_cache

    try:
        found = find_cache(
            str(pte["path"]),
            ptd=None if ptd is None else str(ptd["path"]),
            directory=directory,
            full=False,
        )
    except (PteStoreError, OSError):  # no runtime here, an unreadable file: none said kept
        return None
    return None if found is None else str(found.path)


def not_delivered(done: str, why: str, kept: str | None, *, none: bool = False) -> str:
    """What a failed delivery's error says after its cause: the pair (``done``) and what
    became of its packed-weight file (``why`` in parentheses; ``none``: said as "no
    XNNPACK packed-weight file was"), the one installed earlier for it ``kept``."""
    if kept is None:
        said = (
            "no XNNPACK packed-weight file was"
            if none
            else "its XNNPACK packed-weight file was not"
        )
        return f"{done}, {said}" + (f" ({why})" if why else "")
    notes = "; ".join(n for n in (why, f"the one installed earlier, {kept}, was kept") if n)
    return f"{done}, its XNNPACK packed-weight file was not replaced ({notes})"
