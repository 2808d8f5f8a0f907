"""``ptestore.select``: the best artifact of a model for a device, from a job's index.

Every live entry of the model (never a retired one, :mod:`.retire`) is rated by the
backends that made it (their ``check_compatibility(stamped string, device)``, loaded
here by the SPEC the index records): an entry is as good as its worst backend.
``optimal`` beats ``prefer_respecialization``; among equals the entry made for the
device's own name wins. When nothing fits (every entry ``unsupported``, or the backends are not
installed here), the answer is the model's portable source. The answer says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..backends.compat import Compatibility, DeviceProfile
from ..backends.registry import load_backend
from ..errors import ConfigurationError, PteStoreError

__all__ = ["Choice", "select"]

_RANK = {
    Compatibility.OPTIMAL: 2,
    Compatibility.PREFER_RESPECIALIZATION: 1,
    Compatibility.UNSUPPORTED: 0,
}


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
        }


def _rate(entry: dict[str, Any], device: DeviceProfile) -> tuple[Compatibility, str]:
    worst, why = Compatibility.OPTIMAL, "every backend rates it optimal"
    for stamp in entry.get("compatibility") or []:
        spec = stamp.get("spec", "")
        try:
            impl = load_backend(spec)
            rating = impl.check_compatibility(stamp.get("compatibility", ""), device)
        except PteStoreError as exc:
            return Compatibility.UNSUPPORTED, f"backend {spec!r} cannot rate it here: {exc}"
        except Exception as exc:
            return Compatibility.UNSUPPORTED, (
                f"backend {spec!r}: check_compatibility failed: {type(exc).__name__}: {exc}"
            )
        if not isinstance(rating, Compatibility):  # a backend that breaks its contract
            return Compatibility.UNSUPPORTED, f"backend {spec!r} returned {rating!r}"  # type: ignore[unreachable]
        if _RANK[rating] < _RANK[worst]:
            worst = rating
            why = f"{spec} rates its {stamp.get('id')} data {rating.value}"
    return worst, why


def select(
    index: dict[str, Any] | str | os.PathLike[str],
    model: str,
    device: DeviceProfile | str,
    *,
    storage_options: dict[str, Any] | None = None,
) -> Choice:
    """The best artifact of ``model`` in ``index`` (an index object, or its URL) for
    ``device`` (a profile, or a name: then the options recorded for that name in the
    index, if any, else none). Raises :class:`ConfigurationError` when the index has
    no such model."""
    from .index import load_index

    idx = index if isinstance(index, dict) else load_index(index, **(storage_options or {}))
    live = [e for e in idx.get("entries", []) if not e.get("retired")]  # fleet/retire.py
    entries = [e for e in live if e.get("model") == model]
    if not entries:
        models = sorted({str(e.get("model")) for e in live})
        gone = any(e.get("model") == model for e in idx.get("entries", []))
        raise ConfigurationError(
            f"index has no model {model!r}"
            + (" (its entries are retired: the job no longer names it)" if gone else "")
            + f" (models: {', '.join(models) or 'none'})"
        )
    if isinstance(device, str):
        own = next((e for e in entries if e.get("device") == device), None)
        options = own.get("device_options") if own is not None else None
        device = DeviceProfile(device, options or {})
    rated = []
    for e in entries:
        rating, why = _rate(e, device)
        rated.append((e, rating, why))
    candidates = [
        {"made_for": e.get("device"), "rating": r.value, "reason": why} for e, r, why in rated
    ]
    fits = [x for x in rated if x[1] is not Compatibility.UNSUPPORTED]
    if fits:
        fits.sort(key=lambda x: (-_RANK[x[1]], x[0].get("device") != device.name))
        e, rating, why = fits[0]
        return Choice(
            model,
            device.name,
            "artifact",
            e["pte"],
            e.get("ptd"),
            rating.value,
            f"made for {e.get('device')!r}: {why}",
            e.get("device"),
            candidates,
        )
    first = entries[0]
    why_not = "; ".join(f"{c['made_for']}: {c['reason']}" for c in candidates)
    return Choice(
        model,
        device.name,
        "source",
        dict(first["source"]),
        None if first.get("ptd_source") is None else dict(first["ptd_source"]),
        None,
        f"no artifact of {model!r} fits {device.name!r} "
        f"({why_not}): "
        "falling back to the portable source",
        None,
        candidates,
    )
