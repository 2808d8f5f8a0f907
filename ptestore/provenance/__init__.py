"""Provenance: what every specialized artifact records about how it was made.

- :mod:`.trailer`: the binary trailer after the last segment (read, write, hide);
- :mod:`.record`: the typed record and the key that decides whether it is current;
- :mod:`.stamp`: making it during a run (sources, backends, device, S3 metadata);
- :mod:`.chunks`: chunk digests and their root; :mod:`.check`: checking an artifact's
  bytes, whole or a byte range, against its record.

:func:`read_provenance` reads the record of an artifact; :func:`provenance_json` is
what ``ptestore inspect --json`` shows under ``provenance``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._lazy import lazy_names
from ..errors import FormatError

if TYPE_CHECKING:
    from ..storage.types import DataLoader
    from .check import BytesChecked, check_bytes
    from .record import (
        BackendStamp,
        DeviceStamp,
        Provenance,
        ProvenanceKey,
        RequestedBackend,
        SourceInfo,
    )
    from .stamp import (
        ProvenanceRequest,
        Stamper,
        describe_source,
        object_metadata,
        spec_text,
    )
    from .trailer import Trailer, encode_trailer, read_trailer, without_trailer

#: Names of :mod:`.record`, :mod:`.stamp` and :mod:`.trailer`, imported on first use:
#: turning a record back into a :class:`Provenance` (an ``ensure`` hit) needs neither the
#: stamper nor the trailer's reader, and hiding a source's trailer (every run) needs
#: neither the record nor the stamper.
_LAZY = {
    **dict.fromkeys(
        (
            "BackendStamp",
            "DeviceStamp",
            "Provenance",
            "ProvenanceKey",
            "RequestedBackend",
            "SourceInfo",
        ),
        "record",
    ),
    **dict.fromkeys(
        ("ProvenanceRequest", "Stamper", "describe_source", "object_metadata", "spec_text"),
        "stamp",
    ),
    **dict.fromkeys(("Trailer", "encode_trailer", "read_trailer", "without_trailer"), "trailer"),
    **dict.fromkeys(("BytesChecked", "check_bytes"), "check"),
}

__all__ = [
    "BackendStamp",
    "BytesChecked",
    "DeviceStamp",
    "Provenance",
    "ProvenanceKey",
    "ProvenanceRequest",
    "RequestedBackend",
    "SourceInfo",
    "Stamper",
    "Trailer",
    "check_bytes",
    "describe_source",
    "encode_trailer",
    "object_metadata",
    "provenance_json",
    "read_provenance",
    "read_trailer",
    "replace_trailer",
    "spec_text",
    "without_trailer",
]


__getattr__ = lazy_names(__name__, _LAZY)


def read_provenance(loader: DataLoader) -> Provenance | None:
    """The provenance record of the object behind ``loader``; None if it has no trailer.

    Raises :class:`~ptestore.errors.FormatError` for a damaged trailer or record, and
    for a record whose ``content.size`` is not where its trailer starts."""
    from .record import Provenance
    from .trailer import read_trailer

    trailer = read_trailer(loader)
    if trailer is None:
        return None
    return Provenance.of_trailer(trailer, loader.name)


def provenance_json(loader: DataLoader) -> dict[str, Any] | None:
    """What ``inspect --json`` shows under ``"provenance"``: the record plus the trailer's
    placement and checksum, ``None`` when there is no trailer, or ``{"error": ...}`` for a
    damaged one."""
    from .record import Provenance
    from .trailer import read_trailer

    try:
        trailer = read_trailer(loader)
        if trailer is None:
            return None
        record = Provenance.of_trailer(trailer, loader.name).to_dict()
    except FormatError as exc:
        return {"error": str(exc)}
    record["trailer"] = {
        "offset": trailer.content_size,
        "size": trailer.size,
        "sha256": "sha256:" + trailer.sha256,
    }
    return record


def replace_trailer(data: bytes | bytearray | memoryview, payload: dict[str, Any]) -> bytes:
    """``data`` (a whole file) with its trailer, if any, replaced by one for ``payload``
    (in memory; for tests and small tools)."""
    from ..storage.loaders import BytesLoader
    from .trailer import encode_trailer, read_trailer

    loader = BytesLoader(data)
    trailer = read_trailer(loader)
    end = len(memoryview(data)) if trailer is None else trailer.content_size
    return bytes(memoryview(data)[:end]) + encode_trailer(payload, end)
