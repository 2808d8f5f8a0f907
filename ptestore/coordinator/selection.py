"""Which implementation serves which backend id of the program."""

from __future__ import annotations

from collections.abc import Iterable

from ..backends.api import BackendInterface
from ..backends.registry import BackendLike, load_backend, registered_backends
from ..errors import ConfigurationError

__all__ = ["resolve_backends"]


def resolve_backends(
    backends: Iterable[BackendLike] | None, ids: list[str]
) -> tuple[dict[str, BackendInterface], list[str]]:
    """Map backend ids of the program to implementations.

    ``backends=None`` takes every registered backend whose name is an id of the
    program. Otherwise each given implementation serves its ``name``, and one generic
    (``name == "*"``) implementation serves every id left. Returns the mapping and the
    names given explicitly that no id of the program matches.
    """
    chosen: dict[str, BackendInterface] = {}
    wildcard: BackendInterface | None = None
    if backends is None:
        registry = registered_backends()
        for bid in ids:
            if bid in registry:
                chosen[bid] = load_backend(bid)
        return chosen, []
    for spec in backends:
        impl = load_backend(spec)
        name = getattr(impl, "name", "*")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"backend {impl!r} has no usable name: {name!r}")
        if name == "*":
            if wildcard is not None:
                raise ConfigurationError(
                    f"two generic backends given ({wildcard!r} and {impl!r}); "
                    "use NAME@BACKEND_ID to choose which id each serves"
                )
            wildcard = impl
        elif name in chosen:
            raise ConfigurationError(
                f"two implementations given for backend id {name!r}: {chosen[name]!r} and {impl!r}"
            )
        else:
            chosen[name] = impl
    unused = sorted(name for name in chosen if name not in ids)
    if wildcard is not None:
        for bid in ids:
            chosen.setdefault(bid, wildcard)
    return chosen, unused
