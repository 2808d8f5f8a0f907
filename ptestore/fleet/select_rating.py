"""How ``select`` rates an entry for a device (:mod:`.select`'s docstring says the
rules): each backend installed here that a stamp names asked, the worst rating wins,
and who may get an entry made for another device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backends.compat import Compatibility, DeviceProfile
from ..errors import BackendError, PteStoreError

if TYPE_CHECKING:
    from ..backends.api import BackendInterface

__all__ = ["NO_OPINION", "RANK", "Raters", "combine", "own_entry", "rate_entry"]

#: The rating of a backend that has no compatibility check (or is not installed here).
NO_OPINION = "no_opinion"
#: Each rating's rank (higher: better).
RANK = {
    Compatibility.OPTIMAL.value: 3,
    Compatibility.PREFER_RESPECIALIZATION.value: 2,
    NO_OPINION: 1,
    Compatibility.UNSUPPORTED.value: 0,
}
_POSITIVE = (Compatibility.OPTIMAL.value, Compatibility.PREFER_RESPECIALIZATION.value)


def combine(ratings: list[str]) -> str:
    """The rating of an artifact from its backends' ratings: the worst wins
    (``optimal`` > ``prefer_respecialization`` > ``no_opinion`` > ``unsupported``);
    no ratings at all is ``no_opinion``."""
    for r in ratings:
        if r not in RANK:
            raise ValueError(f"unknown rating {r!r} (known: {', '.join(RANK)})")
    return min(ratings, key=RANK.__getitem__) if ratings else NO_OPINION


class Raters:
    """The backends installed here, looked up by the id (or installed name) a stamp
    records; each loaded at most once per :func:`select`."""

    def __init__(self) -> None:
        from ..backends.registry import installed_backends

        self._installed = [i for i in installed_backends() if i.error is None]
        self._serves = {i.name: i.serves for i in self._installed}
        self._loaded: dict[str, BackendInterface | str] = {}

    def find(self, backend_id: str, spec: str) -> tuple[BackendInterface | None, str]:
        """The implementation installed here for a stamp, and how it was found (or, with
        None, why there is none)."""
        ref = spec.partition("=")[0].partition("@")[0].strip()
        name = None
        if self._serves.get(ref) in (backend_id, "*"):  # an installed name for this id
            name = ref
        else:
            name = next((i.name for i in self._installed if i.serves == backend_id), None)
        if name is None:
            return None, f"no backend installed here serves {backend_id!r}"
        if name not in self._loaded:
            from ..backends.registry import load_backend

            try:
                self._loaded[name] = load_backend(name)  # a name, never the index's text
            except PteStoreError as exc:
                self._loaded[name] = str(exc)
        impl = self._loaded[name]
        if isinstance(impl, str):
            return None, f"the backend installed here as {name!r} cannot be loaded: {impl}"
        return impl, f"installed {name!r}"


def _has_check(impl: BackendInterface) -> bool:
    from ..backends.api import BackendInterface

    own = "check_compatibility" in getattr(impl, "__dict__", {})
    return own or type(impl).check_compatibility is not BackendInterface.check_compatibility


def _rate_stamp(stamp: dict[str, Any], device: DeviceProfile, raters: Raters) -> tuple[str, str]:
    """One backend's rating of its stamp for ``device``, and why."""
    backend_id, spec = str(stamp.get("id", "")), str(stamp.get("spec", ""))
    impl, how = raters.find(backend_id, spec)
    if impl is None:
        return NO_OPINION, f"{backend_id}: {how} (no opinion)"
    if not _has_check(impl):
        return NO_OPINION, f"{backend_id}: {how} has no compatibility check (no opinion)"
    from ..backends.rating import rate

    try:  # backend code: a failure (a sys.exit() too) or a wrong answer is no vouching
        rating = rate(impl, str(stamp.get("compatibility", "")), device, backend_id)
    except PteStoreError as exc:  # a BackendError (named here), or a file it read
        said = exc.message if isinstance(exc, BackendError) else str(exc)
        return Compatibility.UNSUPPORTED.value, f"{backend_id}: {how} cannot rate it: {said}"
    return rating.value, f"{backend_id}: {how} rates it {rating.value}"


def own_entry(entry: dict[str, Any], device: DeviceProfile, by_name: bool = False) -> bool:
    """Whether ``entry`` was made for ``device``: its name and, when recorded (and the
    device was not given by name only), its options digest."""
    if entry.get("device") != device.name:
        return False
    digest = entry.get("device_digest")
    return by_name or digest is None or digest == device.digest()


def rate_entry(
    entry: dict[str, Any], device: DeviceProfile, raters: Raters, by_name: bool
) -> tuple[str, str, bool]:
    """An entry's rating for ``device``, why, and whether the device may get it."""
    stamps = entry.get("compatibility") or []
    rated = [_rate_stamp(s, device, raters) for s in stamps]
    rating = combine([r for r, _ in rated])
    why = "; ".join(w for _, w in rated) or "no backend made any of its data (generic)"
    if rating == Compatibility.UNSUPPORTED.value:
        return rating, why, False
    if own_entry(entry, device, by_name) or not stamps or rating in _POSITIVE:
        return rating, why, True
    return rating, f"{why}: {_made_for_another(entry, device)}", False


def _made_for_another(entry: dict[str, Any], device: DeviceProfile) -> str:
    """Why a device may not get ``entry``, made for another device or, under its own
    name, for another profile of it (the options that differ named)."""
    tail = "and not every backend installed here rates it for this one"
    if entry.get("device") != device.name:
        return f"made for another device, {tail}"
    options = entry.get("device_options")
    if isinstance(options, dict):
        from ..provenance.profile import option_changes

        changes = option_changes(options, dict(device.options))
        changes = changes.removeprefix("options changed: ")
        differ = f"from the index's options to this device's: {changes}"
    else:  # a catalog's stand-in: no options, only their digest
        differ = "its options' digest is not this device's"
    return (
        f"made for another profile of {device.name!r}, {tail} ({differ}; options given "
        "must be the index's exactly, a name alone takes them)"
    )
