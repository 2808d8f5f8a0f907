"""Is a destination's bytes the ones its provenance record names?

The record holds the SHA-256 and CRC-32 of the bytes before the trailer (``content``).
How each store is checked without trusting the record alone:

- **S3**: a ``HEAD`` with ``ChecksumMode=ENABLED``. ptestore's S3 writer uploads every
  object with a full-object CRC-32 (``ChecksumType=FULL_OBJECT``) that the server checks
  on upload; when the stored CRC-32 equals the one the record implies (the content's
  CRC combined with the trailer's), the object is trusted without downloading it. An
  object without a full-object CRC-32 (written by another tool, or a store that keeps
  none) is read in full and its SHA-256 compared instead.
- **local files and every other store**: a full read and the SHA-256.

The CRC-32 catches damage and any rewrite by ordinary tools; it is no defence against
someone who can write the bucket and forges a matching CRC on purpose (``ptestore
verify`` compares the SHA-256 with a full read).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from ..errors import FormatError, ObjectNotFound
from ..provenance.digest import content_digest, object_crc32
from ..provenance.record import ContentDigest, Provenance, ProvenanceKey
from ..provenance.trailer import Trailer, read_trailer
from ..storage.types import DataLoader

__all__ = ["bytes_mismatch", "check_artifact", "stored_crc32"]


def stored_crc32(loader: DataLoader) -> int | None:
    """The full-object CRC-32 S3 keeps for the object behind ``loader`` (the version
    the loader opened), or None when it is no S3 object or has none."""
    fs: Any = getattr(loader, "fs", None)
    path = getattr(loader, "path", None)
    if fs is None or not isinstance(path, str) or type(fs).__name__ != "S3FileSystem":
        return None
    import fsspec.asyn

    bucket, key, version = fs.split_path(path)
    params: dict[str, Any] = {"Bucket": bucket, "Key": key, "ChecksumMode": "ENABLED"}
    if version:
        params["VersionId"] = version
    try:
        head = fsspec.asyn.sync(fs.loop, fs._call_s3, "head_object", **params)
    except Exception:  # no checksum then: the caller reads the bytes instead
        return None
    etag = getattr(loader, "etag", None)
    if etag is not None and head.get("ETag") != etag:
        return None  # replaced since it was opened: let the full read decide
    value = head.get("ChecksumCRC32")
    kind = head.get("ChecksumType")
    if not isinstance(value, str) or (kind is not None and kind != "FULL_OBJECT"):
        return None
    if "-" in value:
        return None  # a composite checksum of parts
    try:
        return int.from_bytes(base64.b64decode(value), "big")
    except ValueError:
        return None


def bytes_mismatch(loader: DataLoader, trailer: Trailer, prov: Provenance) -> str | None:
    """Why the object's bytes are not the ones ``prov`` names, or None when they are."""
    if prov.content is None:
        return (
            f"{loader.name}: the record names no digest of its bytes (made by an older "
            "ptestore); nothing binds it to this file"
        )
    crc = stored_crc32(loader)
    if crc is not None:
        want = object_crc32(prov.content, trailer.raw())
        if crc != want:
            return (
                f"{loader.name}: the stored CRC-32 {crc:08x} is not the {want:08x} its "
                "provenance implies: the bytes were damaged or changed after they were made"
            )
        return None
    got = content_digest(loader, trailer.content_size)
    if got.sha256 != prov.content.sha256:
        return (
            f"{loader.name}: the bytes before the trailer have {got.sha256}, the provenance "
            f"records {prov.content.sha256}: damaged or changed after they were made"
        )
    return None


def check_artifact(
    urls: list[str],
    open_: Callable[[str], DataLoader],
    want: ProvenanceKey,
    ptd_check: Callable[[str, Provenance], tuple[bool, str]] | None = None,
) -> tuple[bool, str]:
    """``(current, reason)`` for the artifact at ``urls`` (the .pte, then its .ptd):
    each file has a valid trailer whose key is ``want`` and whose bytes are the ones it
    names, and the .pte's record names this very .ptd. With ``ptd_check``, ``urls`` is
    the .pte alone and ``ptd_check(url, record)`` checks the .ptd its record names
    (one stored once by content, :func:`.shared.check_shared_ptd`)."""
    contents: list[ContentDigest | None] = []
    records: list[Provenance] = []
    for url in urls:
        try:
            loader = open_(url)
        except ObjectNotFound:
            return False, f"no artifact at {url}"
        try:
            trailer = read_trailer(loader)
            if trailer is None:
                return False, f"{url} has no provenance trailer"
            prov = Provenance.from_dict(trailer.record(), loader.name)
            diff = prov.key().mismatches(want)
            if diff:
                return False, f"stale: {'; '.join(diff)}"
            bad = bytes_mismatch(loader, trailer, prov)
            if bad is not None:
                return False, bad
        except FormatError as exc:
            return False, f"damaged provenance trailer: {exc}"
        finally:
            loader.close()
        contents.append(prov.content)
        records.append(prov)
    if ptd_check is not None:
        return ptd_check(urls[0], records[0])
    if len(urls) > 1 and records[0].ptd_output != contents[1]:
        return False, (
            f"{urls[1]} is not the .ptd {urls[0]} was made with: it belongs to another "
            "pair or device"
        )
    return True, "current: provenance and bytes match"

