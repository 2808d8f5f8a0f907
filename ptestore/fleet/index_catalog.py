"""A model's catalog in an index v3: what ``select`` needs to rate every live entry of
the model without reading them all.

``select`` rates each live entry of a model by its ``compatibility`` stamps, and an
entry's rating for a device depends on its stamps only (and on whether it was made for
that device, which ``select`` learns from the device's own entry). Entries with the
same stamps rate the same, and among equals the one whose device name sorts first wins.
So the catalog keeps, per distinct list of stamps (a *class*), the stamps and the
**first** ``listed`` device names of its live members in sorted order::

    {"format": "ptestore.index-catalog", "version": 3, "model": "mlp",
     "leaves": {"0": 0, "1": 2},             # the trie's leaves per depth (index_trie)
     "classes": [{"compatibility": [...], "devices": ["a", "c"], "more": false}]}

``more`` says that members beyond the listed ones may exist. The listed names are always
the smallest members (a new member is listed only when it sorts before the last one, or
the list is complete and short); when removals empty a class's list while ``more`` is
set, the writer that did it rebuilds the catalog from the model's leaves (:func:`rebuild`).
The catalog's size grows with the number of distinct stamp lists of the model, never
with its devices.

The leaves are the truth: a writer updates its leaves first, then the catalog (by
compare-and-swap, with *set* semantics: "device d is a member of class C, of no other"),
and checks again the entries whose placement it changed (:mod:`.index_v3`). An entry an
update retires is the exception: taken out of the catalog before its leaf is written, so
no crash leaves a retired entry listed (``select`` lists the catalog's devices as
candidates, and checks only the entry it picks against its leaf).

A placement that leaves the catalog as it is writes nothing, so a rebuild could commit
a catalog made from leaves read before such a writer's leaf write. A rebuild therefore
first marks the catalog (``"rebuilding": <token>``, by compare-and-swap), then reads the
leaves, then replaces the marked version by compare-and-swap; a writer that finds the
mark always writes (a new token), which fails the rebuild's commit and makes it read the
leaves again. A rebuild that finds the catalog marked already takes it as it is (a new
mark would fail the commit of the rebuild in flight: rebuilds marking again in turn
failed each other's). Readers ignore the mark.
"""

from __future__ import annotations

import bisect
import copy
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..errors import FormatError
from .index_bounds import check_name

__all__ = [
    "CATALOG_FORMAT",
    "REBUILDING",
    "apply_placements",
    "check_catalog",
    "class_key",
    "depth_range",
    "live_stamps",
    "MAX_DEPTH_SPREAD",
    "marked",
    "needs_rebuild",
    "rebuild",
]

CATALOG_FORMAT = "ptestore.index-catalog"
#: The field a rebuild marks the catalog with while it reads the leaves.
REBUILDING = "rebuilding"


def marked(catalog: dict[str, Any]) -> dict[str, Any]:
    """``catalog`` with a new rebuild mark (a new token: always another version)."""
    import secrets

    return {**catalog, REBUILDING: secrets.token_hex(8)}


def class_key(stamps: list[Any]) -> str:
    """One string per distinct list of stamps."""
    return json.dumps(stamps, sort_keys=True, separators=(",", ":"))


def live_stamps(entry: dict[str, Any] | None) -> list[Any] | None:
    """The stamps of a live entry (None for no entry or a retired one)."""
    if entry is None or entry.get("retired"):
        return None
    stamps = entry.get("compatibility") or []
    return list(stamps) if isinstance(stamps, list) else []


def _empty(model: str) -> dict[str, Any]:
    return {
        "format": CATALOG_FORMAT,
        "version": 3,
        "model": model,
        "leaves": {"0": 1},
        "classes": [],
    }


def check_catalog(value: dict[str, Any], url: str, listed: int) -> dict[str, Any]:
    """``value`` if it is a catalog of a layout listing ``listed`` names per class,
    else :class:`FormatError` naming the field. No class lists more than ``listed``
    names (``select`` reads a leaf per name it tries). Its depths are not held to its
    leaf count: the counts are a summary that concurrent splits can leave short, and a
    write whose outcome was unknown, that landed and was replaced before it was read
    again, long (its splits counted twice: :meth:`~.index_store.IndexStore.update`);
    :func:`depth_range` bounds what a reader reads at once instead."""
    if value.get("format") != CATALOG_FORMAT:
        raise FormatError(url, "index catalog format", value.get("format"), repr(CATALOG_FORMAT))
    if not isinstance(value.get(REBUILDING, ""), str):
        raise FormatError(url, f"index catalog {REBUILDING}", value[REBUILDING], "a string")
    leaves = value.get("leaves")
    if not isinstance(leaves, dict):
        raise FormatError(url, "index catalog leaves", leaves, "an object of depth: count")
    for depth, count in leaves.items():
        if not (depth.isascii() and depth.isdigit() and int(depth) <= 256):
            raise FormatError(url, "index catalog leaves", depth, "a depth in 0..256")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise FormatError(url, f"index catalog leaves.{depth}", count, "an int >= 0")
    classes = value.get("classes")
    if not isinstance(classes, list):
        raise FormatError(url, "index catalog classes", classes, "a list of classes")
    for i, c in enumerate(classes):
        field = f"index catalog classes[{i}]"
        if not isinstance(c, dict):
            raise FormatError(url, field, c, "an object")
        stamps = c.get("compatibility")
        if not isinstance(stamps, list) or not all(isinstance(x, dict) for x in stamps):
            raise FormatError(url, f"{field}.compatibility", stamps, "a list of objects")
        devices = c.get("devices")
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise FormatError(url, f"{field}.devices", devices, "a list of strings")
        for j, name in enumerate(devices):
            check_name(name, url, f"{field}.devices[{j}]")
        if len(devices) > listed:
            raise FormatError(
                url, f"{field}.devices (names)", len(devices), f"at most {listed} (layout listed)"
            )
        if not isinstance(c.get("more"), bool):
            raise FormatError(url, f"{field}.more", c.get("more"), "a bool")
    return value


#: Depths a reader reads at once from the shallowest the catalog names: a device hash
#: spreads a model's leaves over a few depths; a catalog claiming a wider spread (stale,
#: or ``{"0": 1, "200": 1}``) is read that far at once, then a depth at a time below a
#: split marker, as for a catalog behind its leaves.
MAX_DEPTH_SPREAD = 8


def depth_range(catalog: dict[str, Any] | None) -> tuple[int, int]:
    """The shallowest and deepest depth the model's leaves are at (``(0, 0)`` without a
    catalog), at most :data:`MAX_DEPTH_SPREAD` apart."""
    if catalog is None:
        return 0, 0
    depths = [int(k) for k, v in catalog["leaves"].items() if v > 0]
    if not depths:
        return 0, 0
    lo = min(depths)
    return lo, min(max(depths), lo + MAX_DEPTH_SPREAD)


def _place(cls: dict[str, Any], device: str, listed: int) -> bool:
    """Record ``device`` as a member of ``cls``; True when the record changed."""
    devices: list[str] = cls["devices"]
    if device in devices:
        return False
    if not devices and cls["more"]:
        return False  # the order is unknown until the catalog is rebuilt
    if len(devices) < listed and not cls["more"]:
        bisect.insort(devices, device)
        return True
    if device < devices[-1]:
        bisect.insort(devices, device)
        if len(devices) > listed:
            devices.pop()
            cls["more"] = True
        return True
    if not cls["more"]:
        cls["more"] = True
        return True
    return False


def apply_placements(
    catalog: dict[str, Any] | None,
    model: str,
    placements: dict[str, list[Any] | None],
    splits: list[int],
    listed: int,
) -> tuple[dict[str, Any] | None, set[str]]:
    """The catalog with each device of ``placements`` a member of the class of its stamps
    (None: of no class) and the trie's ``splits`` counted; None when nothing changes
    (never for a catalog a rebuild has marked: it gets a new mark). Also returns the
    devices whose record changed."""
    if catalog is None and not placements and not splits:
        return None, set()
    cat = copy.deepcopy(catalog) if catalog is not None else _empty(model)
    classes = {class_key(c["compatibility"]): c for c in cat["classes"]}
    changed: set[str] = set()
    for device, stamps in placements.items():
        key = None if stamps is None else class_key(stamps)
        for k, cls in classes.items():
            if k != key and device in cls["devices"]:
                cls["devices"].remove(device)
                changed.add(device)
        if key is not None:
            cls = classes.setdefault(key, {"compatibility": stamps, "devices": [], "more": False})
            if _place(cls, device, listed):
                changed.add(device)
    leaves = Counter({int(k): v for k, v in cat["leaves"].items()})
    for depth in splits:
        leaves[depth] -= 1
        leaves[depth + 1] += 2
    cat["leaves"] = {str(k): leaves[k] for k in sorted(leaves) if leaves[k] > 0}
    kept = [c for c in classes.values() if c["devices"] or c["more"]]
    cat["classes"] = sorted(kept, key=_order)
    if catalog is not None and REBUILDING in catalog:
        return marked(cat), changed
    if catalog is not None and cat == catalog:
        return None, set()
    return cat, changed


def _order(cls: dict[str, Any]) -> tuple[list[str], str]:
    return list(cls["devices"][:1]), class_key(cls["compatibility"])


def needs_rebuild(catalog: dict[str, Any] | None) -> bool:
    """Whether a class lists no device although it has members (:func:`rebuild`)."""
    return catalog is not None and any(not c["devices"] and c["more"] for c in catalog["classes"])


def rebuild(
    model: str,
    entries: Iterable[dict[str, Any]],
    leaves: Counter[int],
    listed: int,
) -> dict[str, Any]:
    """The catalog of ``model`` from all its entries and its leaves per depth."""
    members: dict[str, tuple[list[Any], list[str]]] = {}
    for e in entries:
        stamps = live_stamps(e)
        if stamps is None:
            continue
        members.setdefault(class_key(stamps), (stamps, []))[1].append(str(e["device"]))
    classes: list[dict[str, Any]] = []
    for stamps, devices in members.values():
        devices.sort()
        classes.append(
            {"compatibility": stamps, "devices": devices[:listed], "more": len(devices) > listed}
        )
    classes.sort(key=_order)
    cat = _empty(model)
    cat["leaves"] = {str(k): leaves[k] for k in sorted(leaves) if leaves[k] > 0}
    cat["classes"] = classes
    return cat
