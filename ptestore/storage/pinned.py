"""A ranged read of one version of an S3 object: the ``GetObject`` parameters that pin it
(``If-Match: <ETag>``, the version id on a versioned bucket: a replaced object answers
412, never a mix of two versions) and the check that the answer holds the range asked
for (its ``Content-Range``). Used by the loader's reads (:mod:`.remote`) and by fetch's
streamed downloads (:mod:`ptestore.fleet.ranged`)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "answered_range",
    "get_params",
    "longer_body_message",
    "other_range_message",
    "read_at_most",
]


def get_params(
    bucket: str, key: str, etag: str | None, version_id: str | None, first: int, end: int
) -> dict[str, Any]:
    """The ``GetObject`` parameters of bytes ``[first, end)`` of the version with
    ``etag`` (and ``version_id``; either None: not pinned by it)."""
    params: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={first}-{end - 1}"}
    if etag is not None:
        params["IfMatch"] = etag
    if version_id is not None:
        params["VersionId"] = version_id
    return params


def answered_range(resp: dict[str, Any], first: int, end: int) -> str | None:
    """None when the response to ``Range: bytes=first-(end-1)`` holds that range (its
    ``Content-Range``; without one, the whole object, which must then be that range);
    else what it holds, as the server said it."""
    got = resp.get("ContentRange")
    if got is None:
        length = resp.get("ContentLength")
        if first == 0 and length == end:
            return None
        return f"with no Content-Range ({length} bytes: the whole object)"
    if not isinstance(got, str) or not got.startswith(f"bytes {first}-{end - 1}/"):
        return f"Content-Range: {got}"
    return None


def other_range_message(name: str, first: int, end: int, other: str) -> str:
    """The error for an answer that holds another range than ``[first, end)``."""
    return (
        f"{name}: asked the server for Range: bytes={first}-{end - 1}, it answered {other}: "
        "another range than the one asked for; its bytes are refused"
    )


async def read_at_most(body: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of the streaming ``body`` (anything with an async
    ``read(n)``: aiobotocore's ``StreamingBody``, aiohttp's ``StreamReader``), fewer
    only where it ends (``read(n)`` may answer with less than ``n`` before the end: it
    is asked again). What follows is never read: a reader that must know whether a body
    is longer than the ``n`` bytes it wants asks for ``n + 1``."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        part = await body.read(limit - got)
        if not part:
            break
        parts.append(bytes(part))
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def longer_body_message(name: str, first: int, end: int) -> str:
    """The error for an answer to ``Range: bytes=first-(end-1)`` whose body goes on past
    the ``end - first`` bytes asked for (read no further than one byte more)."""
    return (
        f"{name}: asked the server for Range: bytes={first}-{end - 1} ({end - first} "
        f"bytes), its answer is longer: read no further than {end - first + 1} bytes, "
        "the rest left unread; its bytes are refused"
    )
