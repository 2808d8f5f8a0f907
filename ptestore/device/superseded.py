"""What a job index answered last for an entry ``ensure(index, model=..., device=...)``
fetched from it, once that answer names no artifact any more.

The entry fetched from an index is keyed on the index, the model and the device name
(:func:`.indexed.index_key`). When the index, read since, answers that no artifact fits
the device (the device or its build was dropped from the job and retired, and no other
device's build fits: :func:`~ptestore.select` falls back to the model's portable
source), the entry's artifact is not what the index selects any more: its manifest then
records that answer (``"superseded"``: the device profile it was given for and the
choice, :func:`supersede`), under the key's exclusive lock, its files left as they are
(a process that was handed their paths keeps them; the next fetch of the model takes its
chunks from them). Such an entry is never a hit (:func:`.artifact.lookup`) and never
served offline, for any profile of the device (the index no longer names it for that
device name; offline, nothing tells whether it still would for another profile): offline,
the last answer is what is served, the portable source, to the profile it was given for
(or a device named alone: :func:`last_answer`, :mod:`.from_index`); to another profile,
nothing. A later answer naming an artifact again fetches it into the entry, which drops
the record. When the index selects nothing at all for the model (its entries all retired:
:class:`~ptestore.errors.ModelRetired`), that answer is recorded (:func:`retired_answer`)
for every profile of the device's name, and offline nothing is served.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from .._dataclass import replace
from ..errors import FormatError, PteStoreError, StorageError
from .entryfiles import check_entry_dir, read_manifest
from .manifest import as_json, publish_manifest

if TYPE_CHECKING:
    from ..backends.compat import DeviceProfile
    from ..fleet.select import Choice
    from .layout import CacheLayout

__all__ = [
    "RETIRED",
    "SUPERSEDED",
    "answer_of",
    "applies",
    "last_answer",
    "retired_answer",
    "supersede",
    "supersede_locked",
]

#: The manifest field that records the index's answer.
SUPERSEDED = "superseded"


def answer_of(choice: Choice, device: DeviceProfile) -> dict[str, Any]:
    """The record of ``choice`` (the portable source) given for ``device``: the device's
    name and option digest, its options, and what was chosen (the files and why)."""
    said = choice.to_dict()
    out: dict[str, Any] = as_json(
        {
            "device": [device.name, device.digest()],
            "device_options": dict(device.options),
            # What it chose, without what varies from one read to the next (what was
            # read, the candidates' ratings): the same answer is recorded once.
            "choice": {k: said[k] for k in _KEPT},
        }
    )
    return out


def retired_answer(model: str, device: DeviceProfile | str) -> dict[str, Any]:
    """The record of the index's answer that every entry of ``model`` is retired
    (:class:`~ptestore.errors.ModelRetired`): it applies to every profile of the
    device's name, and serves nothing offline."""
    name = device if isinstance(device, str) else device.name
    return {
        "device": [name, None],
        "device_options": {},
        "choice": {"model": model, "kind": RETIRED},
    }


#: The kind of a recorded answer that selected nothing: the model's entries retired.
RETIRED = "retired"

#: What a record keeps of the choice.
_KEPT = ("model", "device", "kind", "made_for", "rating", "reason", "pte", "ptd")


def applies(record: Any, device: DeviceProfile | str) -> bool:
    """Whether the recorded answer ``record`` is the last one for ``device``: given for
    the same profile (name and option digest); for a device named alone, any recorded
    for its name (the key's), as the offline entry of a name is the one fetched for it."""
    if not isinstance(record, dict):
        return False
    if isinstance(device, str) or _kind(record) == RETIRED:  # retired: for every profile
        return True
    return bool(record.get("device") == [device.name, device.digest()])


def supersede(layout: CacheLayout, key: str, index: str, record: dict[str, Any]) -> None:
    """Record the index's answer ``record`` (:func:`answer_of`) in entry ``key`` when it
    holds an artifact fetched from ``index``, under the key's exclusive lock (waiting
    for a process that uses or makes it, within the call's ``lock_timeout``). Nothing
    to do, and no lock taken, when there is no entry or it records that answer already."""
    if not os.path.isdir(layout.entry_dir(key)):
        return
    try:
        manifest = read_manifest(layout.manifest(key), private=True)
    except PteStoreError:  # read again under the lock, where it is judged
        manifest = {}
    if manifest is None or manifest.get(SUPERSEDED) == record:
        return
    with layout.lock(key):
        supersede_locked(layout, key, index, record)


def supersede_locked(layout: CacheLayout, key: str, index: str, record: dict[str, Any]) -> None:
    """:func:`supersede` with the key's lock held exclusively by the caller. An entry
    that is not a real directory of this user's, or whose manifest cannot be read as one
    of this user's alone, is left alone: it is never served offline either (the offline
    path refuses it as a hit does)."""
    try:
        check_entry_dir(layout.entry_dir(key))
        manifest = read_manifest(layout.manifest(key), private=True)
    except (FormatError, StorageError):
        return
    if manifest is None or manifest.get(SUPERSEDED) == record:
        return
    path = layout.manifest(key)
    used = os.stat(path)
    publish_manifest(layout, key, {**manifest, SUPERSEDED: record}, index)
    # Its last use as it was (the manifest's modification time): recording the answer
    # is no use of the entry, which eviction takes in that order.
    with contextlib.suppress(OSError):
        os.utime(path, ns=(used.st_atime_ns, used.st_mtime_ns))


def last_answer(
    layout: CacheLayout, key: str, device: DeviceProfile | str
) -> tuple[bool, Choice | None, DeviceProfile | None]:
    """What entry ``key`` records as the index's last answer for ``device``, read under
    the key's shared lock: ``(False, None, None)`` when it records none for it (serve
    the entry, if it was made for the device and records no answer for another
    profile); else ``(True, choice, profile)``: the portable source to serve and the
    profile it was chosen for, or ``(True, None, None)`` when the record cannot be read
    as one (nothing is served)."""
    if not os.path.isdir(layout.entry_dir(key)):
        return False, None, None
    with layout.lock(key, shared=True):
        check_entry_dir(layout.entry_dir(key))
        try:
            manifest = read_manifest(layout.manifest(key), private=True)
        except FormatError:
            return False, None, None
    record = None if manifest is None else manifest.get(SUPERSEDED)
    if not applies(record, device):
        return False, None, None
    assert isinstance(record, dict)
    return (True, *_source_of(record))


def _kind(record: dict[str, Any]) -> Any:
    choice = record.get("choice")
    return choice.get("kind") if isinstance(choice, dict) else None


def _source_of(record: dict[str, Any]) -> tuple[Choice | None, DeviceProfile | None]:
    """The portable source ``record`` names, as :func:`~ptestore.select` chose it, and
    the profile it was chosen for; ``(None, None)`` for a record not of that form."""
    from ..backends.compat import DeviceProfile
    from ..fleet.select import Choice

    c, device, options = record.get("choice"), record.get("device"), record.get("device_options")
    if not isinstance(c, dict) or c.get("kind") != "source" or not isinstance(options, dict):
        return None, None
    if not (isinstance(device, list) and device and isinstance(device[0], str)):
        return None, None
    files = (c.get("pte"), c.get("ptd"))
    if not isinstance(files[0], dict) or not (files[1] is None or isinstance(files[1], dict)):
        return None, None
    if any(f is not None and not isinstance(f.get("url"), str) for f in files):
        return None, None
    if not isinstance(c.get("model"), str) or not isinstance(c.get("reason"), str):
        return None, None
    try:
        profile = DeviceProfile(device[0], options)
    except PteStoreError:
        return None, None
    choice = Choice(c["model"], device[0], "source", files[0], files[1], None, c["reason"], None)
    return replace(choice, device_options=options), profile
