"""The bounds a fleet index's readers hold its objects to, and the checks of what a
publish writes that keep every object within them (docs/fleet.md, "Bounds")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..errors import ConfigurationError, FormatError, PteStoreError

__all__ = [
    "ENTRY_FILES",
    "ENTRY_ROOM",
    "MAX_CATALOG_BYTES",
    "MAX_ENTRY_BYTES",
    "MAX_ENTRY_DEPTH",
    "MAX_INDEX_DEPTH",
    "MAX_ROOT_BYTES",
    "MAX_V2_BYTES",
    "check_entry_size",
    "check_files",
    "check_name",
    "check_named_url",
    "check_origin",
    "check_root_size",
    "check_v2_entries",
    "names_shown",
    "trusted_origins",
    "oversize",
    "parse_object",
    "v2_entry_problems",
]

#: Levels of JSON arrays and objects an index object may nest: a leaf is level 1, its
#: entries 2, an entry 3, its ``device_options`` 4 and their own levels (at most
#: :data:`~ptestore.backends.compat.MAX_OPTIONS_DEPTH`) below: the bound of a provenance
#: record (:data:`~ptestore.provenance.trailer.MAX_RECORD_DEPTH`), whence they come.
MAX_INDEX_DEPTH = 64

# What a reader reads of one index object at most, checked from the size the store
# gives before the body is read (S3's Content-Length; a local file or memory:// object
# past it is never held): an object past its bound is refused as a FormatError naming
# it, its size and the bound, never downloaded and parsed.
#: A version 3 root: a few hundred bytes (format, version, created, layout, migrated).
MAX_ROOT_BYTES = 64 << 10
#: A version 1/2 index, one object holding every entry (about 1.4 KB an entry: 10^5
#: pairs are 160 MB): what a legacy index of hundreds of thousands of pairs needs still
#: reads. An object at the root URL past :data:`MAX_ROOT_BYTES` is read with this bound
#: only once its first bytes show a version 1/2 index (:mod:`.index_root`).
MAX_V2_BYTES = 1 << 30
#: A catalog: one class per distinct kind of build of a model, a few hundred bytes each
#: with its ``listed`` names (500 kinds: about 80 KB): tens of thousands of kinds of
#: build, more than a fleet has distinct SoC, driver and backend versions for a model.
MAX_CATALOG_BYTES = 16 << 20
#: The largest entry a publish writes (compact JSON): its options and stamps come from
#: a provenance record, at most 1 MiB (``MAX_PAYLOAD_SIZE``).
MAX_ENTRY_BYTES = 2 << 20
#: What a leaf may hold past its layout's ``leaf_bytes``: the entry that crossed it
#: (until the leaf splits), or one entry alone with the leaf's own fields (which repeat
#: its model name).
ENTRY_ROOM = 2 * MAX_ENTRY_BYTES + 4096


def oversize(url: str, what: str, size: int, cap: int) -> FormatError:
    """The error of an index object larger than its bound."""
    return FormatError(url, f"{what} size", size, f"at most {cap} bytes", "not read")


def check_root_size(value: dict[str, Any], size: int, url: str) -> None:
    """A version 3 root of ``size`` bytes is at most :data:`MAX_ROOT_BYTES`, once parsed
    (one whose first bytes showed no version, only entries, was read as a version 1/2
    index may be: :mod:`.index_root`)."""
    if value.get("version") == 3 and size > MAX_ROOT_BYTES:
        raise FormatError(
            url, "index size", size, f"at most {MAX_ROOT_BYTES} bytes", "a version 3 root"
        )


def _not_utf8_at(name: str) -> int | None:
    """Where ``name`` stops having a UTF-8 form (a lone surrogate), or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def check_name(name: str, url: str, field: str) -> None:
    """A model or device name is UTF-8 text (its hash places it: a lone surrogate such
    as ``"\\ud800"``, valid JSON, has no UTF-8 form), else :class:`FormatError`."""
    at = _not_utf8_at(name)
    if at is not None:
        raise FormatError(url, field, name[:60], "UTF-8 text", f"a lone surrogate at index {at}")


def check_asked(what: str, name: str) -> None:
    """A model or device name a caller asks an index for is UTF-8 text (a command-line
    argument of bytes that are not UTF-8 arrives as lone surrogates), else
    :class:`ConfigurationError` naming it: hashing it to find its shard raised a bare
    ``UnicodeEncodeError``."""
    at = _not_utf8_at(name)
    if at is not None:
        raise ConfigurationError(
            f"{what} {name!r}: not valid UTF-8 text (character {name[at]!r} at index {at}): "
            "an index names models and devices in UTF-8"
        )


#: Levels an entry may nest (:func:`check_entry_size`): the object holding it (a leaf,
#: a version 2 index) and its ``entries`` array are two more.
MAX_ENTRY_DEPTH = MAX_INDEX_DEPTH - 2


def check_entry_size(entry: dict[str, Any], url: str, field: str) -> None:
    """An entry to publish is at most :data:`MAX_ENTRY_BYTES` (compact JSON) and nests
    at most :data:`MAX_ENTRY_DEPTH` levels: a leaf holding it stays within what readers
    read (``leaf_bytes`` + :data:`ENTRY_ROOM`, :data:`MAX_INDEX_DEPTH` levels). One
    deeper was written, and every reader then refused its leaf: every device of its
    model."""
    import json

    from .._jsondepth import json_depth

    size = len(json.dumps(entry, separators=(",", ":")).encode())  # as a leaf holds it
    if size > MAX_ENTRY_BYTES:
        raise FormatError(url, f"{field} size", size, f"at most {MAX_ENTRY_BYTES} bytes")
    depth = json_depth(entry)
    if depth > MAX_ENTRY_DEPTH:
        raise FormatError(
            url,
            f"{field} (nesting depth)",
            depth,
            f"at most {MAX_ENTRY_DEPTH} levels of arrays and objects",
            f"the index's objects nest at most {MAX_INDEX_DEPTH}",
        )


#: The fields of an entry that name its files, and those of them that may be null.
ENTRY_FILES = ("pte", "ptd", "source", "ptd_source")
_NULLABLE = ("ptd", "ptd_source")


def check_files(entry: dict[str, Any], source: str, name: str, roles: Iterable[str]) -> None:
    """Each of ``roles`` (of :data:`ENTRY_FILES`) of ``entry`` (``name`` in messages,
    read from ``source``) is an object with a ``url`` (a non-empty string), the ``ptd``
    ones an object or null, else :class:`FormatError` naming the entry and the field:
    what ``select`` and gc hold an entry's files to."""
    for role in roles:
        rec = entry.get(role)
        if rec is None and role in _NULLABLE:
            continue
        if not isinstance(rec, dict):
            raise FormatError(source, f"{name} {role}", rec, "an object")
        if not isinstance(rec.get("url"), str) or not rec["url"]:
            raise FormatError(source, f"{name} {role}.url", rec.get("url"), "a URL or path")


#: The protocols of an index on this machine: whatever it names, the device opens (its
#: own index); an index from any other store names only objects of that store's protocol.
_OWN_INDEXES = frozenset({"file", "memory"})


#: Origins (``(protocol, host, port)`` as :func:`~ptestore.storage.types.url_origin`
#: gives them) an index read from a server may name objects of besides its own.
Origins = frozenset[tuple[str, str, str]]
_WEB = ("http", "https")


def trusted_origins(given: Sequence[str] | None) -> Origins:
    """The origins ``given`` (``trusted_origins=``, CLI ``--trust-origin``), each
    ``http(s)://HOST[:PORT]`` (a final ``/`` allowed), as compared (the default port
    given, the host in lower case); one that is not (another scheme, user information,
    a path, a query or a fragment, no host, a port that is not a number) is a
    :class:`ConfigurationError` naming it, before anything is read."""
    from .._text import shown

    if given is None:
        return frozenset()
    if isinstance(given, str | bytes):
        raise ConfigurationError(
            f"trusted_origins must be a list of origins, not one string: got {shown(given)}"
        )
    from ..storage.types import url_origin

    out = set()
    for value in given:
        problem = _not_an_origin(value)
        if problem is not None:
            raise ConfigurationError(
                f"trusted origin {shown(value)} (trusted_origins=, CLI --trust-origin): must be "
                f"an origin, http(s)://HOST[:PORT] (e.g. https://cdn.example.com): {problem}"
            )
        out.add(url_origin(value))
    return frozenset(out)


def _not_an_origin(value: object) -> str | None:
    """Why ``value`` is not an origin :func:`trusted_origins` takes, or None."""
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        return f"a string, got {type(value).__name__}"
    if any(c.isspace() or not c.isprintable() for c in value):
        return "it holds a space or a control character"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError as exc:
        return str(exc)
    if parts.scheme.lower() not in _WEB:
        return "not an http:// or https:// URL"
    if "@" in parts.netloc:
        return "it holds user information"
    if not parts.hostname:
        return "it names no host"
    if parts.path not in ("", "/"):
        return f"it has a path ({parts.path!r})"
    if parts.query or "?" in value:
        return "it has a query"
    if parts.fragment or "#" in value:
        return "it has a fragment"
    return None


def check_named_url(
    url: object,
    source: str,
    field: str,
    trusted: Origins = frozenset(),
    *,
    reader: str = "index",
) -> None:
    """The URL ``url`` that ``field`` of the index object ``source`` names is one a
    device may open: from an index of this machine (a local file, ``memory://`` of this
    process, or one given as an object, ``"<index>"``) any, as the index is the
    device's own; from a remote one (``s3://``) only a URL of the index's own protocol,
    never a local path, ``file://``, ``memory://``, another service's URL
    (``http(s)://`` from an ``s3://`` index: a metadata service) nor another scheme; from
    an index read from a server (``http(s)://``) only a URL of that server (the same
    protocol, host and port: the storage options' headers go to it) or of one of the
    ``trusted`` origins (:func:`trusted_origins`: the caller sends them its headers too),
    never a URL of another scheme (a redirect to another origin is held to the same
    rule when the files are fetched: :func:`ptestore.storage.redirects.index_redirects`);
    else :class:`FormatError` naming the index, the field and the URL, raised before
    anything is requested (docs/fleet.md, "What an index may name"). URLs are taken as
    the index writes them (absolute: a relative one is a local path). Not a URL (not a
    string) is :func:`check_files`' to say. ``reader``: what ``source`` is, as messages
    name it (``"record"``: the XNNPACK record beside an artifact fetched by URL, held to
    the rule of an index at the artifact's URL)."""
    from ..storage.types import split_url, url_origin

    if not isinstance(url, str):
        return
    home = split_url(source)[0]
    if home in _OWN_INDEXES:
        return
    protocol = split_url(url)[0]
    if home in _WEB and protocol in _WEB and url_origin(url) in trusted:
        return
    if protocol == home:
        if home in _BUCKET_PROTOCOLS:
            return
        own = url_origin(source)
        if url_origin(url) == own:
            return
        raise FormatError(
            source,
            field,
            url,
            f"a URL on the {reader}'s own server ({own[0]}://{own[1]}:{own[2]})"
            + (" or of a trusted origin" if trusted else ""),
            f"{_article(reader)} read from a server names only objects of that server"
            + (" and of the origins trusted" if trusted else "")
            + ": the storage options (headers, credentials) are never sent to another "
            "host or port"
            + ("" if trusted else " unless trusted (trusted_origins=, CLI --trust-origin)"),
        )
    raise FormatError(
        source,
        field,
        url,
        f"a URL on the {reader}'s own store ({home}://)",
        f"{_article(reader)} read from a store names only objects of its protocol: a local path, "
        "file://, or a URL of another protocol or service is never opened nor requested",
    )


def _article(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


#: Protocols whose URLs name a bucket (or container) of the one service the storage
#: options address (its endpoint and credentials are options, not in the URL): an
#: index there may name any bucket of it.
_BUCKET_PROTOCOLS = frozenset({"s3", "gs", "gcs", "az", "abfs", "abfss", "adl"})


def check_origin(
    entry: dict[str, Any],
    source: str,
    name: str,
    roles: Iterable[str],
    trusted: Origins = frozenset(),
) -> None:
    """The URL of each of ``roles`` (of :data:`ENTRY_FILES`, or ``xnnpack``) of
    ``entry`` (``name`` in messages, read from ``source``) passes
    :func:`check_named_url`: what ``select`` holds the files it hands out to, for
    ``select``, ``fetch`` and ``ensure`` alike (gc, which opens none of them, does not)."""
    for role in roles:
        rec = entry.get(role)
        if isinstance(rec, dict):
            check_named_url(rec.get("url"), source, f"{name} {role}.url", trusted)


@contextlib.contextmanager
def names_shown(urls: Iterable[object]) -> Iterator[None]:
    """A ptestore error raised inside (a fetch of the files an index names, the
    specialization of the portable source it names) shows each of ``urls`` it embeds
    as a report prints a string from a file (:func:`ptestore._text.names_cut`: cut to
    300 characters, its line breaks and control characters escaped), its type,
    attributes and cause kept: an index naming a 3 MB URL, or one holding a line
    break, makes a one-line error of a few hundred characters, here and in what embeds
    it (``ensure``'s offline reason)."""
    names = [u for u in urls if isinstance(u, str)]
    try:
        yield
    except PteStoreError as exc:
        from .._text import names_cut

        if exc.args and isinstance(exc.args[0], str):
            cut = names_cut(exc.args[0], names)
            if cut is not exc.args[0]:
                exc.args = (cut, *exc.args[1:])
        raise


def v2_entry_problems(entries: list[Any], url: str) -> list[FormatError]:
    """What is wrong with each entry of a version 1/2 index (read from ``url``) that no
    reader can take as an entry: not an object, or its ``model`` or ``device`` not a
    string (UTF-8 text), each as a :class:`FormatError` naming the index, the entry's
    position and the field (as a version 3 leaf's reader refuses a malformed entry).
    Skipped, it hid a model's entry: ``select`` handed out the portable source."""
    out: list[FormatError] = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            out.append(
                FormatError(url, f"index entries[{i}]", e, "an object with a model and a device")
            )
            continue
        for name in ("model", "device"):
            if not isinstance(e.get(name), str):
                out.append(FormatError(url, f"index entries[{i}].{name}", e.get(name), "a string"))
                break
            try:
                check_name(e[name], url, f"index entries[{i}].{name}")
            except FormatError as exc:
                out.append(exc)
                break
    return out


def check_v2_entries(entries: list[Any], url: str) -> list[dict[str, Any]]:
    """``entries`` (a version 1/2 index's, read from ``url``) when every one is an entry
    (:func:`v2_entry_problems`), else the first problem, raised."""
    for problem in v2_entry_problems(entries, url):
        raise problem
    return entries


def parse_object(data: bytes, url: str) -> dict[str, Any]:
    """The JSON object in ``data`` (read from ``url``), else :class:`FormatError` (not
    JSON, nested more than :data:`MAX_INDEX_DEPTH` levels, not an object)."""
    from .._jsondepth import load_bounded

    value = load_bounded(data, url, "index", MAX_INDEX_DEPTH)
    if not isinstance(value, dict):
        raise FormatError(url, "index", type(value).__name__, "a JSON object")
    return value
