"""``ptestore.select``: the best artifact of a model for a device, from a job's index.

An index is data: nothing it names is imported or called. Every live entry of the
model (never a retired one, :mod:`.retire`)
is rated on this machine by the backends **installed here** (registered with
``register_backend``, an entry point of ``ptestore.backends``, or one of ptestore's
own), found by the id each of the entry's ``compatibility[]`` stamps records (the
stamp's ``spec`` is used only when it is an installed name, never as an import path or
with its ``=ARGUMENT``); each is asked ``check_compatibility(stamped string, device)``.

The rule for combining the ratings of an entry's backends: **the worst wins**, in the
order ``optimal`` > ``prefer_respecialization`` > ``no_opinion`` > ``unsupported``. A
backend that does not define ``check_compatibility``, or an id no backend installed
here serves, is ``no_opinion``: never ``optimal``. Who may get an entry:

- the device it was made for (the same name and, when the index records it, the same
  options digest): any rating but ``unsupported``;
- any other device (one the job did not name, or another profile): only when every
  backend installed here positively rates it for that device (``optimal`` or
  ``prefer_respecialization``), or when the entry is **generic** (no backend made any of
  its data: its ``compatibility`` list is empty). ``no_opinion`` is never enough to hand
  a device another device's build.

``optimal`` beats ``prefer_respecialization`` beats ``no_opinion``; among equals the entry
made for the device wins. When nothing fits, the answer is the model's portable source.
The answer says why.

An entry of a device that declared its CPU fingerprint lists XNNPACK's packed-weight
file (:mod:`.packed`); the answer reports it (``xnnpack``) only when it was made for the
selecting machine's CPU (or the ``cpu`` given): a file for another CPU is of no use here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._dataclass import dataclass, field
from ..backends.compat import DeviceProfile
from ..errors import ConfigurationError, FormatError, ModelRetired
from .select_rating import NO_OPINION, RANK, Raters, combine, own_entry, rate_entry

if TYPE_CHECKING:
    from .index_bounds import Origins

__all__ = [
    "MAX_REASONS",
    "NO_OPINION",
    "Choice",
    "combine",
    "select",
    "select_from",
]

#: How many candidates the reason of a fallback to the portable source explains at most,
#: each cut to :data:`~ptestore._text.REPORT_CHARS` characters (``candidates`` has them
#: all, whole).
MAX_REASONS = 8


@dataclass
class Choice:
    """What :func:`select` picked: ``kind`` ``"artifact"`` or ``"source"`` (the
    portable model), the files to fetch and why."""

    model: str
    device: str
    kind: str
    pte: dict[str, Any]
    ptd: dict[str, Any] | None
    rating: str | None
    reason: str
    #: The device name the artifact was made for (None for the source).
    made_for: str | None = None
    #: Every candidate and its rating, in the order they were considered.
    candidates: list[dict[str, Any]] = field(default_factory=list)
    #: The artifact's XNNPACK packed-weight file as the index lists it (a file, or why
    #: the fleet's runtime refused one), when it was made for this CPU; else None.
    xnnpack: dict[str, Any] | None = None
    #: What was read of an index given by URL: ``{"objects", "bytes", "requests"}``.
    index_read: dict[str, int] | None = None
    #: Kinds of build (distinct compatibility stamps) with more devices than a sharded
    #: index lists: ``candidates`` names the first of each, not every one.
    unlisted: int = 0
    #: The options of the device the candidates were rated for: those given, or for a
    #: device given by name, those the index records for that name (not in
    #: :meth:`to_dict`; ``ensure`` keys and specializes with them).
    device_options: dict[str, Any] = field(default_factory=dict)
    #: Kinds of build past the first :data:`~.index_view.MAX_CLASSES` of a sharded
    #: index's catalog: not rated.
    unrated: int = 0
    #: Why the artifact's packed-weight field for this CPU is not reported: malformed
    #: (:func:`.packed_field.check_field`; ``fetch`` and ``ensure`` treat it as a
    #: delivery that failed).
    xnnpack_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "kind": self.kind,
            "made_for": self.made_for,
            "rating": self.rating,
            "reason": self.reason,
            "pte": self.pte,
            "ptd": self.ptd,
            "candidates": self.candidates,
            "xnnpack": self.xnnpack,
            "index_read": self.index_read,
            "unlisted_candidates": self.unlisted,
            "unrated_builds": self.unrated,
            "xnnpack_error": self.xnnpack_error,
        }


def _checked(entry: dict[str, Any], source: str, trusted: Origins, *roles: str) -> dict[str, Any]:
    """``entry`` (read from ``source``) when the fields ``select`` uses are sound: its
    stamps a list of objects and each of ``roles`` an object with a ``url`` (the ``ptd``
    ones may be null) that the index may name (``trusted``: the origins besides its
    own), else :class:`FormatError` naming the entry and field."""
    name = _name(entry)
    stamps = entry.get("compatibility")
    if stamps is not None and (
        not isinstance(stamps, list) or not all(isinstance(x, dict) for x in stamps)
    ):
        raise FormatError(source, f"{name} compatibility", stamps, "a list of objects")
    if "device_options" in entry:  # a whole entry (a catalog's stand-in has none)
        _check_options(entry, source, name)
    from .index_bounds import check_files, check_origin

    check_files(entry, source, name, roles)
    check_origin(entry, source, name, roles, trusted)  # a remote index: its own store
    return entry


def _check_options(entry: dict[str, Any], source: str, name: str) -> None:
    """The entry's ``device_options`` are a device's options (null: none), as
    :class:`DeviceProfile` takes them, else :class:`FormatError`."""
    from ..errors import ConfigurationError

    options = entry["device_options"]
    if options is None:
        return
    if not isinstance(options, dict):
        raise FormatError(source, f"{name} device_options", options, "an object")
    try:
        DeviceProfile(str(entry.get("device")), options)
    except ConfigurationError as exc:
        raise FormatError(
            source, f"{name} device_options", options, "a device's options", str(exc)
        ) from None


def select(
    index: dict[str, Any] | str | os.PathLike[str],
    model: str,
    device: DeviceProfile | str,
    *,
    storage_options: dict[str, Any] | None = None,
    cpu: str | None = None,
    trusted_origins: Sequence[str] | None = None,
) -> Choice:
    """The best artifact of ``model`` in ``index`` (an index object, or its URL) for
    ``device`` (a profile, or a name: then the options recorded for that name in the
    index, if any, else none). Raises :class:`ConfigurationError` when the index has
    no such model. ``cpu``: the CPU fingerprint the packed-weight file must have been
    made for to be reported (default: this machine's). From a sharded index (version 3)
    it reads a few small objects (:mod:`.index_view`), whatever the size of the fleet.
    ``storage_options`` are for the index: one that applies to none of it (any, for a
    local index) is a :class:`ConfigurationError` before it is read.
    ``trusted_origins``: origins (``https://cdn.example.com[:PORT]``) whose objects an
    index read over http(s) may name besides its own server's; the storage options go
    to them too (docs/fleet.md, "What an index may name")."""
    if isinstance(index, dict):
        if storage_options:
            raise ConfigurationError(
                f"storage options {sorted(storage_options)} apply to no URL: the index "
                "was given as an object, not read"
            )
    else:  # select reads the index only: options apply to it, before it is read
        from .._args import path_argument
        from .index_store import check_index_options

        check_index_options(storage_options, path_argument(index, "index"))
    return select_from(
        index,
        model,
        device,
        storage_options=storage_options,
        cpu=cpu,
        trusted_origins=trusted_origins,
    )


def select_from(
    index: dict[str, Any] | str | os.PathLike[str],
    model: str,
    device: DeviceProfile | str,
    *,
    storage_options: dict[str, Any] | None = None,
    cpu: str | None = None,
    trusted_origins: Sequence[str] | None = None,
) -> Choice:
    """:func:`select`, its ``storage_options`` already checked by the caller (``fetch``
    and ``ensure`` check them against their own URLs too)."""
    from .index_bounds import check_asked
    from .index_bounds import trusted_origins as origins_of
    from .index_view import model_view

    trusted = origins_of(trusted_origins)  # before anything is read
    name = device if isinstance(device, str) else device.name
    check_asked("model", model)
    check_asked("device", name)
    view = model_view(index, model, name, storage_options)
    entries = view.entries
    where = "<index>" if isinstance(index, dict) else os.fspath(index)
    if not entries and view.unfound:
        raise view.unfound_error(where)
    if not entries:
        models, more = view.models()
        listed = ", ".join(models) + (f" and {more} more" if more else "")
        retired = " (its entries are retired: the job no longer names it)"
        raise (ModelRetired if view.retired_only else ConfigurationError)(
            f"{where}: index has no model {model!r}"
            + (retired if view.retired_only else "")
            + f" (models: {listed or 'none'})"
        )
    by_name = isinstance(device, str)
    if isinstance(device, str):
        own = next((e for e in entries if e.get("device") == device), None)
        mine = None if own is None else _checked(own, view.source(own, where), trusted)
        options = None if mine is None else mine.get("device_options")
        device = DeviceProfile(device, options or {})
    raters = Raters()
    # The stand-ins and members of a class are one kind of build: rated once (index_view)
    once: dict[int, tuple[str, str, bool]] = {}
    rated = []
    for e in entries:
        key = view.kind(e)
        if key not in once:
            once[key] = rate_entry(
                _checked(e, view.source(e, where), trusted), device, raters, by_name
            )
        rated.append((e, *once[key]))
    candidates = [
        {"made_for": e.get("device"), "rating": r, "eligible": ok, "reason": why}
        for e, r, why, ok in rated
    ]
    position = {id(e): i for i, (e, *_) in enumerate(rated)}
    read = None if view.reads is None else view.reads
    fits = [x for x in rated if x[3]]
    fits.sort(key=lambda x: (-RANK[x[1]], not own_entry(x[0], device, by_name)))
    for e, rating, why, _ in fits:
        full = view.resolve(e)
        full = (
            None
            if full is None
            else _checked(full, view.source(full, where), trusted, "pte", "ptd")
        )
        if full is None:  # changed since the catalog was read: the next best
            c = candidates[position[id(e)]]
            c["eligible"] = False
            c["reason"] = f"{c['reason']}; changed in the index while it was read (not used)"
            continue
        packed, packed_error = _packed_for(full, cpu, view.source(full, where), trusted)
        return Choice(
            model,
            device.name,
            "artifact",
            full["pte"],
            full.get("ptd"),
            rating,
            f"made for {full.get('device')!r}: {why}",
            full.get("device"),
            candidates,
            packed,
            None if read is None else read.to_dict(),
            view.unlisted,
            dict(device.options),
            view.unrated,
            packed_error,
        )
    if view.unfound:  # kinds not found in the leaves were not rated: no answer yet
        raise view.unfound_error(where)
    first = next((f for f in map(view.resolve, entries) if f is not None), None)
    if first is None:
        raise ConfigurationError(
            f"{where}: no entry of model {model!r} the catalog lists is in its leaves as "
            "listed: changed while it was read, or the catalog disagrees with its leaves; "
            f"run again, and if it persists, repair it: ptestore fleet check-index {where} "
            "--repair"
        )
    _checked(first, view.source(first, where), trusted, "source", "ptd_source")
    return Choice(
        model,
        device.name,
        "source",
        dict(first["source"]),
        None if first.get("ptd_source") is None else dict(first["ptd_source"]),
        None,
        f"no artifact of {model!r} fits {device.name!r} "
        f"({_why_not(candidates, view.unrated)}): "
        "falling back to the portable source",
        None,
        candidates,
        None,
        None if read is None else read.to_dict(),
        view.unlisted,
        dict(device.options),
        view.unrated,
    )


def _why_not(candidates: list[dict[str, Any]], unrated: int) -> str:
    """Why each candidate was refused, for the reason of a fallback: the first
    :data:`MAX_REASONS`, each cut to :data:`~ptestore._text.REPORT_CHARS` characters
    (whatever the index's catalog holds, the reason is a line)."""
    from .._text import clipped
    from .index_view import MAX_CLASSES

    said = [clipped(f"{c['made_for']}: {c['reason']}") for c in candidates[:MAX_REASONS]]
    if len(candidates) > MAX_REASONS:
        said.append(f"and {len(candidates) - MAX_REASONS} more")
    if unrated:
        said.append(f"{unrated} kinds of build past the first {MAX_CLASSES} not rated")
    return "; ".join(said)


def _packed_for(
    entry: dict[str, Any], cpu: str | None, source: str, trusted: Origins
) -> tuple[dict[str, Any] | None, str | None]:
    """An entry's packed-weight field when it was made for ``cpu`` (None: this
    machine's CPU fingerprint), checked (read from ``source``); a malformed one is
    not reported: ``(None, why)``."""
    packed = entry.get("xnnpack")
    if packed is None:
        return None, None
    if isinstance(packed, dict):  # (not an object: malformed, whatever CPU it is for)
        if cpu is None:
            from ..xnnpack.identity import cpu_fingerprint

            cpu = cpu_fingerprint()
        if packed.get("cpu") != cpu:
            return None, None
    from .index_bounds import check_origin
    from .packed_field import check_field

    try:
        checked = check_field(packed, source, _name(entry))
        check_origin(entry, source, _name(entry), ("xnnpack",), trusted)  # the artifact's
        return checked, None
    except FormatError as exc:
        return None, str(exc)


def _name(entry: dict[str, Any]) -> str:
    """How a message names ``entry``: ``entry MODEL/DEVICE``."""
    return f"entry {entry.get('model')}/{entry.get('device')}"
