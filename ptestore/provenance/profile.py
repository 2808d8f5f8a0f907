"""The device profile a record keeps, as :func:`ptestore.verify` compares it: the profile
a device given by name only is rated with (:func:`named_profile`), and how a profile's
options differ from the ones a record kept (:func:`option_changes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backends.compat import DeviceProfile

if TYPE_CHECKING:
    from .record import Provenance

__all__ = ["named_profile", "option_changes"]


def named_profile(name: str, prov: Provenance) -> tuple[DeviceProfile, str]:
    """The profile a device given by name only is rated with: the options the record
    keeps for that name; else none, and a hint for the finding that may follow."""
    have = prov.device
    if have is not None and have.name == name and have.options is not None:
        return DeviceProfile(name, have.options), ""
    why = (
        "the record keeps no options of the device it was made for"
        if have is not None and have.name == name
        else "no options were given"
    )
    return DeviceProfile(name), f"; {why}: give the profile's options (--device-option K=V)"


def option_changes(was: dict[str, Any] | None, now: dict[str, Any]) -> str:
    """Which device options changed, in words (``was`` None: the record kept none)."""
    if was is None:
        return "the profile's options changed; the record keeps only their digest"
    parts = []
    for k in sorted(set(was) | set(now)):
        if k not in now:
            parts.append(f"{k} removed (was {was[k]!r})")
        elif k not in was:
            parts.append(f"{k} added ({now[k]!r})")
        elif was[k] != now[k]:
            parts.append(f"{k} {was[k]!r} -> {now[k]!r}")
    return "options changed: " + ", ".join(parts) if parts else "the options changed"
