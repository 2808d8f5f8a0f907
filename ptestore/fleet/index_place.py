"""Where an object of a sharded index (version 3) lives, and the check that a node says
it is the one that belongs there.

A model's nodes are in the directory :func:`model_segment` names, a node's name is its
prefix of the device hash (:func:`device_bits`): ``<shards>/m/<model>~<hash8>/t01.json``
holds the entries of the model whose device hashes start with ``01``, and says so in its
``model`` and ``prefix`` fields. A node read from another place than the one it says (a
leaf copied or moved by hand, a sync tool that renamed it) would be listed by every
reader that walks the trie (``load_index``, ``gc``, ``fleet retire``) but never found by
``select``, which looks a device up where its hash leads: :func:`check_place` refuses it
for every reader (docs/fleet.md, "Bounds").

A split marker also names the halves its split made (``"halves": ["0", "1"]``,
:func:`halves_of`): the halves that got entries, each created before the marker is
committed, and a node is never removed. A half it names that is not found is lost
(:mod:`.index_whole`), where a half it does not name may be one the split left empty. A
marker an earlier ptestore wrote names none (the field absent: unknown).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

from ..errors import FormatError
from .index_bounds import check_name

__all__ = ["HALVES", "check_place", "device_bits", "halves_of", "model_segment"]

#: The field of a split marker naming the halves its split made.
HALVES = "halves"
_PLAIN = re.compile(r"[A-Za-z0-9._-]{1,100}")


def model_segment(model: str) -> str:
    """The directory of ``model``'s shards: its name and a hash (two names that differ
    only in letter case stay apart on a case-insensitive disk)."""
    digest = hashlib.sha256(model.encode()).hexdigest()
    if _PLAIN.fullmatch(model) and model not in (".", ".."):
        return f"{model}~{digest[:8]}"
    return f"~{digest[:16]}"


@functools.lru_cache(maxsize=1 << 16)
def device_bits(device: str) -> str:
    """The SHA-256 of ``device`` (UTF-8) as 256 binary digits."""
    digest = hashlib.sha256(device.encode()).digest()
    return format(int.from_bytes(digest, "big"), "0256b")


def halves_of(prefix: str, entries: dict[str, Any]) -> list[str]:
    """The halves a split of the node ``prefix`` holding ``entries`` (by device) makes:
    the bits below it of their devices' hashes (sorted)."""
    return sorted({device_bits(d)[len(prefix)] for d in entries})


def check_place(
    value: dict[str, Any], url: str, prefix: str, segment: str, entries: dict[str, Any]
) -> None:
    """The node ``value``, read from ``url`` (node ``prefix`` of the model directory
    ``segment``) with ``entries`` (by device, names checked), says it is that node: its
    ``prefix`` is its name's, its ``model`` the one the directory is named for, and every
    entry is of that model and of a device whose hash starts with the prefix (a split
    marker's :data:`HALVES`, when there, halves); else :class:`FormatError` naming the
    field, the value found and the one its place gives."""
    halves = value.get(HALVES, ["0"])
    if value.get("state") == "split" and halves not in (["0"], ["1"], ["0", "1"]):
        raise FormatError(
            url, f"index shard {HALVES}", halves, "['0'], ['1'] or ['0', '1'] (its split's)"
        )
    found = value.get("prefix")
    if found != prefix:
        raise FormatError(
            url, "index shard prefix", found, repr(prefix), "the prefix its name t<bits>.json gives"
        )
    model = value.get("model")
    if not isinstance(model, str):
        raise FormatError(url, "index shard model", model, "a string")
    check_name(model, url, "index shard model")
    if model_segment(model) != segment:
        raise FormatError(
            url, "index shard model", model, f"the model of its directory {segment!r}"
        )
    for device, e in entries.items():
        if e.get("model") != model:
            raise FormatError(url, "index shard entry model", e.get("model"), repr(model))
        if not device_bits(device).startswith(prefix):
            raise FormatError(
                url,
                "index shard entry device",
                device,
                f"a device whose hash starts with the leaf's prefix {prefix!r}",
            )
