"""A backend's rating of an artifact, asked in one place.

- :func:`rate`: ``impl.check_compatibility(info, device)``, guarded
  (:func:`~.guard.guarded`: a failure, ``SystemExit`` included, is a
  :class:`~ptestore.errors.BackendError` naming the backend and ``check_compatibility``)
  and its answer checked (anything but a :class:`~.compat.Compatibility` is one too);
- :func:`rate_stamps`: every backend stamp of an artifact's record rated by the
  implementation of its SPEC, for one device: what ``verify --backend`` (and so
  ``verify --job``) and a fleet plan share (:func:`below_optimal` says why a plan makes
  an artifact again); ``select`` rates an index's stamps with :func:`rate` too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._dataclass import dataclass
from ..errors import BackendError
from .compat import Compatibility
from .guard import guarded

if TYPE_CHECKING:
    from .api import BackendInterface
    from .compat import DeviceProfile

__all__ = ["Rating", "below_optimal", "rate", "rate_stamps"]


class Stamp(Protocol):
    """What a record keeps of a backend (``provenance.record.BackendStamp``)."""

    @property
    def id(self) -> str: ...
    @property
    def spec(self) -> str: ...
    @property
    def compatibility(self) -> str: ...


@dataclass(frozen=True)
class Rating:
    """One backend's rating of the data it made of an artifact (``id``: the backend id
    it served; ``spec``: the SPEC that made it; ``stamped``: its compatibility string)."""

    id: str
    spec: str
    rating: Compatibility
    stamped: str


def rate(
    impl: BackendInterface, info: str, device: DeviceProfile | None, backend: str
) -> Compatibility:
    """``impl``'s rating of an artifact it stamped ``info`` for ``device``; a failure or
    an answer that is not a :class:`Compatibility` is a :class:`BackendError` naming
    ``backend`` (its SPEC)."""
    rating: Any = guarded(backend, "check_compatibility", impl.check_compatibility, info, device)
    if not isinstance(rating, Compatibility):
        raise BackendError(
            f"check_compatibility returned {rating!r}, not a Compatibility", backend=backend
        )
    return rating


def rate_stamps(
    stamps: Iterable[Stamp],
    impls: Mapping[str, BackendInterface],
    device: DeviceProfile | None,
) -> list[Rating]:
    """Each stamp rated by the implementation of its SPEC in ``impls`` (SPEC ->
    implementation, the SPECs as provenance records them); a stamp whose SPEC is not
    there is left out."""
    out = []
    for stamp in stamps:
        impl = impls.get(stamp.spec)
        if impl is not None:
            rating = rate(impl, stamp.compatibility, device, stamp.spec)
            out.append(Rating(stamp.id, stamp.spec, rating, stamp.compatibility))
    return out


def below_optimal(
    stamps: Iterable[Stamp],
    impls: Mapping[str, BackendInterface],
    device: DeviceProfile | None,
) -> str | None:
    """Why an artifact should be made again for ``device`` (the first backend that
    rates its data below ``OPTIMAL``, as ``verify`` reports it), or None."""
    for r in rate_stamps(stamps, impls, device):
        if r.rating is not Compatibility.OPTIMAL:
            where = "no device" if device is None else repr(device.name)
            return f"compatibility: {r.spec} rates the {r.id} data {r.rating.value} for {where}"
    return None
