"""A ranged read of one version of an S3 object: the ``GetObject`` parameters that pin it
(``If-Match: <ETag>``, the version id on a versioned bucket: a replaced object answers
412, never a mix of two versions), the ETag an answer must name (:func:`answer_etag`)
and the check that the answer holds the range asked for (its ``Content-Range``; a
server that ignored the range said so). Used by the loader's reads (:mod:`.remote`), by
fetch's streamed downloads (:mod:`ptestore.fleet.ranged`) and by the S3 writer's reads
of its copy sources and of index objects (:mod:`ptestore.writers.s3`).

Also what the loader says of an answer about the object's size (:func:`other_size_message`:
a GET naming another size than the HEAD's; :func:`no_size_message`: a server that names
none) and of an ``http(s)://`` redirect aiohttp would not follow
(:func:`http_redirect_problem`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._text import shown
from ..errors import StorageError
from .types import redacted_url

__all__ = [
    "MAX_ETAG",
    "NOT_USED",
    "answer_etag",
    "answered_range",
    "answered_total",
    "get_params",
    "http_redirect_problem",
    "longer_body_message",
    "no_size_message",
    "other_size_message",
    "other_range_message",
    "read_at_most",
]

#: The longest ETag an answer may name (S3's are a quoted MD5, with ``-N`` for a
#: multipart object: under 50 characters). A longer one is malformed: the writer sends
#: every part's back in ``CompleteMultipartUpload``, a read sends it in ``If-Match``.
MAX_ETAG = 1024

#: What follows from an answer about an object without a usable ETag.
NOT_USED = "the object's version cannot be known, its bytes are not used"


def answer_etag(
    resp: dict[str, Any],
    url: str,
    request: str,
    consequence: str = NOT_USED,
    field: str = "ETag header",
) -> str:
    """The ETag ``request``'s answer names (what pins bytes to one version of ``url``,
    what names an uploaded part; ``field``: where the answer holds it), else
    :class:`~ptestore.errors.StorageError` naming the object, the request and the
    field, and ``consequence``: every S3 answer about an object or a part has one, so
    one without it (or with one that is empty, longer than :data:`MAX_ETAG` or not
    printable ASCII) was changed on its way (a proxy) or comes from a store that cannot
    be read with a version token. A StorageError, as an unreachable store's, never
    retried."""
    etag = resp.get("ETag")
    if not isinstance(etag, str) or not etag:
        raise StorageError(f"{url}: the {request} answer has no {field}: {consequence}")
    if len(etag) > MAX_ETAG or not all(" " <= c <= "~" for c in etag):
        raise StorageError(
            f"{url}: the {request} answer's {field} is malformed: {shown(etag)}: an "
            f"ETag is at most {MAX_ETAG} printable ASCII characters; {consequence}"
        )
    return etag


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
    else what it holds, as the server said it: another range, or the whole object (a
    200 without ``Content-Range``: the server ignored the range), or a partial answer
    that does not say which part (its status in ``ResponseMetadata.HTTPStatusCode``, as
    botocore gives it)."""
    got = resp.get("ContentRange")
    if got is None:
        length = resp.get("ContentLength")
        if first == 0 and length == end:
            return None
        status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if status not in (None, 200):
            return f"HTTP {status} with no Content-Range ({length} bytes): not the range asked for"
        return f"the whole object ({length} bytes, no Content-Range): the server ignored the range"
    if not isinstance(got, str) or not got.startswith(f"bytes {first}-{end - 1}/"):
        return f"Content-Range: {got}: another range than the one asked for"
    return None


def other_range_message(name: str, first: int, end: int, other: str) -> str:
    """The error for an answer that holds another range than ``[first, end)`` (``other``:
    what :func:`answered_range` says it holds)."""
    return (
        f"{name}: asked the server for Range: bytes={first}-{end - 1}, it answered {other}; "
        "its bytes are refused"
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


def _plain(value: str) -> str:
    """A header's value in a message: as it is when short and printable, else
    :func:`~ptestore._text.shown` (quoted, cut)."""
    return value if len(value) <= 100 and value.isprintable() else shown(value)


def answered_total(resp: dict[str, Any]) -> int | None:
    """The object's size as an answer to a ranged read names it: after the ``/`` of its
    ``Content-Range``, else (a 200: the whole object) its ``ContentLength``; None when
    it names none (``*``, no header)."""
    got = resp.get("ContentRange")
    if isinstance(got, str):
        total = got.rpartition("/")[2].strip()
        return int(total) if total.isdigit() else None
    status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    length = resp.get("ContentLength")
    if status == 200 and isinstance(length, int) and not isinstance(length, bool):
        return length
    return None


def other_size_message(name: str, size: int, resp: dict[str, Any]) -> str | None:
    """None when the answer to a ranged read names no size or the object's ``size``
    (what its HEAD said, when the loader opened it); else the error naming both: the
    ranges asked for were cut to a size the object does not have."""
    total = answered_total(resp)
    if total is None or total == size:
        return None
    cr = resp.get("ContentRange")
    said = f"Content-Range: {_plain(cr)}" if isinstance(cr, str) else "the whole object"
    return (
        f"{name}: the server's HEAD said {size} bytes, its GET says {total} ({said}): "
        "the object's size is not known, its bytes are refused (an object replaced "
        "meanwhile, or a server or proxy whose HEAD and GET disagree)"
    )


def no_size_message(name: str, headers: Mapping[str, str] | None) -> str:
    """The error of an ``http(s)://`` object whose server names no size (fsspec's
    ``info`` found none), saying why as the headers of a ``HEAD`` (``Accept-Encoding:
    identity``) show it (None: that HEAD failed too)."""
    why = []
    if headers is None or not str(headers.get("Content-Length", "")).strip().isdigit():
        why.append("no Content-Length")
    encoding = (headers or {}).get("Content-Encoding", "")
    if encoding.strip().lower() not in ("", "identity"):
        why.append(f"Content-Encoding: {_plain(encoding)}")
    return (
        f"{name}: the server reports no size ({'; '.join(why) or 'no Content-Length'}): "
        "ranged reads need an identity-encoded object of known size"
    )


#: aiohttp's redirect errors, known by name (aiohttp is not imported for them).
_TOO_MANY = "aiohttp.client_exceptions.TooManyRedirects"
_REDIRECT = "aiohttp.client_exceptions.RedirectClientError"


def http_redirect_problem(exc: BaseException) -> str | None:
    """What went wrong with a redirect in ``exc``'s cause chain (aiohttp's
    ``TooManyRedirects``: a loop; its ``RedirectClientError``: a ``Location`` that is
    no http(s) URL, ``file://``), or None."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        names = {f"{c.__module__}.{c.__qualname__}" for c in type(current).__mro__}
        if _TOO_MANY in names:
            hops = len(getattr(current, "history", ()) or ())
            return f"redirected {hops} times without reaching the object (a redirect loop?)"
        if _REDIRECT in names:
            url = getattr(current, "url", None) or (current.args or (None,))[0]
            target = redacted_url(str(url or "?"))
            return f"redirected to {shown(target)}, not an http(s) URL: not followed"
        seen.append(current)
        current = current.__cause__ or current.__context__
    return None
