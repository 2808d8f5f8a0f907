"""The object at an index's root URL, read no further than what its first bytes say it
is (docs/fleet.md, "Bounds"); the layout a version 3 root names (:func:`new_layout`,
:func:`check_layout`); and the version 3 shard directories beside a version 1/2 root that
a root once named (docs/fleet.md, "Versions 1 and 2").

The root URL holds a version 3 root (a few hundred bytes, at most
:data:`~.index_bounds.MAX_ROOT_BYTES`) or a version 1/2 index, one object holding every
entry (up to :data:`~.index_bounds.MAX_V2_BYTES`). Which one is known from the object
itself, so an object larger than a version 3 root is judged from its first
:data:`HEAD_BYTES` before the rest is read (:func:`check_root_head`): a version 3 root
padded to hundreds of megabytes was downloaded whole, then refused.

The first bytes decide by the object's top-level members, in order: a ``"version"`` of 1
or 2 (what ptestore writes first), or, before any version, the ``"entries"`` list a
version 1/2 index holds its entries in (keys sorted by a tool: ``entries`` comes first)
lets the rest be read, the whole object then parsed and checked as before; a version 3
(or any other version), or neither within the first bytes, is refused without reading
further. An object whose ``entries`` come before a version 3 is still read whole and
refused once parsed: no version 3 root ptestore writes has entries.

A directory of shards is named by a version 3 root; the writers that create, migrate or
publish into it leave a copy of that root in it (:data:`NAMED`). A version 1/2 root
beside a directory holding that copy is one an older ptestore wrote over a migrated
index (its read of the version 2 index and its rename straddled the migration's swap: a
local writer on another machine, whose ``flock`` did not reach over NFS): what was
published into version 3 since is only in that directory. A directory without the copy
is a migration's private one, under way, or left by one that crashed or lost its race
(never read). :func:`overwritten` says so.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterator
from typing import Any

from ..errors import FormatError
from .index_bounds import MAX_ROOT_BYTES

__all__ = [
    "DEFAULT_LEAF_BYTES",
    "DEFAULT_LISTED",
    "HEAD_BYTES",
    "NAMED",
    "SHARDS",
    "SHARDS_PREFIX",
    "check_layout",
    "check_root_head",
    "local_size",
    "new_layout",
    "overwritten",
    "read_head",
    "top_members",
]

#: What is read of a root URL's object larger than a version 3 root before the rest.
HEAD_BYTES = MAX_ROOT_BYTES
#: The name of a directory of shards (``layout.shards`` of a version 3 root), and how
#: every one begins.
SHARDS_PREFIX = "ptestore-index.v3-"
SHARDS = re.compile(r"ptestore-index\.v3-[0-9a-f]{8,32}")
#: The copy of the version 3 root that named a directory of shards, in that directory.
NAMED = "root.json"
#: A version 3 layout's bounds unless asked otherwise: a leaf's bytes, the devices a
#: catalog lists per class.
DEFAULT_LEAF_BYTES = 16 * 1024
DEFAULT_LISTED = 8


_WS = re.compile(r"[ \t\n\r]*")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")
_NEXT = re.compile(r'["\[\]{}]')
_CUT = object()  # a token that does not decode: the text stops being judged there


def _past_ws(text: str, pos: int) -> int:
    """Where the white space at ``pos`` ends."""
    m = _WS.match(text, pos)
    return pos if m is None else m.end()


def _token(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _CUT


def _skip(text: str, pos: int) -> int | None:
    """Where the array or object starting at ``pos`` ends (None: past ``text``)."""
    depth = 0
    while (m := _NEXT.search(text, pos)) is not None:
        pos = m.start()
        if m.group() == '"':
            s = _STRING.match(text, pos)
            if s is None:
                return None
            pos = s.end()
            continue
        depth += 1 if m.group() in "[{" else -1
        pos += 1
        if depth == 0:
            return pos
    return None


def top_members(text: str) -> Iterator[tuple[str, Any]]:
    """The top-level members of the JSON object ``text`` begins with, in order, as far as
    ``text`` holds them: ``(name, value)`` for a string, number, bool or null, ``(name,
    [])`` or ``(name, {})`` for an array or object (given before it is skipped). Stops,
    without an error, where ``text`` ends or stops reading as an object (a number at its
    very end may be cut): the whole object's parse says what is wrong."""
    pos = _past_ws(text, 0)
    if not text.startswith("{", pos):
        return
    pos += 1
    while True:
        pos = _past_ws(text, pos)
        key = _STRING.match(text, pos)
        name = _CUT if key is None else _token(key.group())
        if key is None or not isinstance(name, str):
            return
        pos = _past_ws(text, key.end())
        if not text.startswith(":", pos):
            return
        pos = _past_ws(text, pos + 1)
        if text[pos : pos + 1] in ("[", "{"):
            yield name, [] if text[pos] == "[" else {}
            end = _skip(text, pos)
        else:
            m = _STRING.match(text, pos) or _SCALAR.match(text, pos)
            if m is None or m.end() >= len(text) or (value := _token(m.group())) is _CUT:
                return  # not a value, or one the end of ``text`` may have cut
            yield name, value
            end = m.end()
        if end is None:
            return
        pos = _past_ws(text, end)
        if not text.startswith(",", pos):
            return
        pos += 1


def check_root_head(head: bytes, size: int, url: str) -> None:
    """The object at the root URL ``url``, of ``size`` bytes (more than a version 3 root
    may have), may be read whole, as a version 1/2 index: its first bytes ``head`` show a
    top-level ``version`` of 1 or 2, or the ``entries`` list before any version; else
    :class:`FormatError` (a version 3 root past its bound, another version, or neither
    within the first :data:`HEAD_BYTES`), nothing more read."""
    text = head[:HEAD_BYTES].decode("utf-8", errors="replace").removeprefix("\ufeff")
    for name, value in top_members(text):
        if name == "version":
            if value in (1, 2) and not isinstance(value, bool):  # as check_index takes it
                return
            if value == 3:
                raise FormatError(
                    url,
                    "index size",
                    size,
                    f"at most {MAX_ROOT_BYTES} bytes",
                    f"a version 3 root: not read past its first {HEAD_BYTES} bytes",
                )
            raise FormatError(url, "index version", value, "1, 2 or 3")
        if name == "entries" and isinstance(value, list):
            return
    raise FormatError(
        url,
        "index size",
        size,
        f"at most {MAX_ROOT_BYTES} bytes",
        f"a version 3 root; its first {HEAD_BYTES} bytes show no version 1 or 2 index, "
        "neither a version nor entries: not read further",
    )


def local_size(url: str) -> int | None:
    """The size of the local file ``url`` names (None: not a local URL, or no file to
    stat): learnt without reading it."""
    from ..storage.types import StorageURL

    u = StorageURL.of(url)
    if not u.local:
        return None
    try:
        return os.stat(u.path).st_size
    except OSError:
        return None


def read_head(url: str, options: dict[str, Any]) -> tuple[bytes, int] | None:
    """The first :data:`HEAD_BYTES` of the object at ``url`` (a ranged read with the
    loader ``options``) and its size; None when there is none."""
    from ..errors import ObjectNotFound
    from ..storage.loaders import open_loader

    try:
        loader = open_loader(url, **options)
    except ObjectNotFound:
        return None
    try:
        size = loader.size()
        return bytes(loader.load(0, min(size, HEAD_BYTES))), size
    finally:
        loader.close()


def overwritten(url: str, version: object, named: list[str]) -> FormatError:
    """The error (or, for a reader that looks one entry up, the warning) of the version
    ``version`` index at ``url`` beside the shard directories ``named``, each named by a
    version 3 root once."""
    return FormatError(
        url,
        "index version",
        version,
        "3",
        f"beside it, {', '.join(named)} holds {NAMED}, the copy of the version 3 root that "
        f"named it: an older ptestore wrote this version {version} index over the migrated "
        "one, and what was published into version 3 since is only there; see "
        "docs/fleet.md, Versions 1 and 2",
    )


def new_layout(
    leaf_bytes: int = DEFAULT_LEAF_BYTES, listed: int = DEFAULT_LISTED
) -> dict[str, Any]:
    """A layout with a directory of its own (never one an earlier index left)."""
    return {
        "shards": f"ptestore-index.v3-{secrets.token_hex(4)}",
        "leaf_bytes": leaf_bytes,
        "listed": listed,
    }


def check_layout(root: dict[str, Any], url: str) -> dict[str, Any]:
    """The layout of the version 3 root ``root``, checked (a directory name ptestore
    made, bounds it can honour), else :class:`FormatError` naming the field."""
    layout = root.get("layout")
    if not isinstance(layout, dict):
        raise FormatError(url, "index layout", layout, "an object")
    shards = layout.get("shards")
    if not isinstance(shards, str) or not SHARDS.fullmatch(shards):
        raise FormatError(url, "index layout.shards", shards, "ptestore-index.v3-<hex>")
    for name, low, high in (("leaf_bytes", 1024, 1 << 24), ("listed", 1, 1000)):
        value = layout.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise FormatError(url, f"index layout.{name}", value, f"an int in [{low}, {high}]")
    return layout
