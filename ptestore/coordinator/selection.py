"""Which implementation serves which backend id of the program."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._dataclass import dataclass, field
from .._log import get_logger
from ..backends.guard import guarded
from ..backends.passthrough import PassthroughBackend
from ..backends.registry import (
    BackendLike,
    backend_label,
    did_you_mean,
    installed_backends,
    load_backend,
    serving,
)
from ..errors import ConfigurationError
from .report import SPECIALIZE_PTD, BackendReport, no_named_data_hint

if TYPE_CHECKING:
    from ..backends.api import BackendInterface

__all__ = ["Selection", "resolve_backends", "why_unchanged"]

log = get_logger("ptestore.selection")


@dataclass
class Selection:
    """The outcome of backend selection for one program."""

    #: backend id -> implementation
    impls: dict[str, BackendInterface] = field(default_factory=dict)
    #: backend id -> how the report names the implementation (its spec)
    labels: dict[str, str] = field(default_factory=dict)
    #: Names given explicitly that no id of the program matches (a typo?).
    unused: list[str] = field(default_factory=list)
    #: Whether ``backends`` was given (False: the default selection).
    explicit: bool = False
    #: ``passthrough`` was named explicitly: an unchanged copy is what was asked for.
    passthrough_requested: bool = False
    #: Every backend given explicitly, as ``(label, id it serves or "*")``.
    given: list[tuple[str, str]] = field(default_factory=list)


def _default(ids: list[str]) -> Selection:
    """Every installed backend whose ``name`` is a backend id of the program, whatever
    its entry point or registration is called; a generic backend (``name == "*"``)
    serves the id it is registered under."""
    sel = Selection()
    for info in installed_backends():
        if info.error is not None:
            # It may be the one that serves this program: never skip it silently.
            load_backend(info.name)  # raises the load error itself
        for bid in ids:
            if not info.serves_id(bid):
                continue
            if bid in sel.labels:
                raise ConfigurationError(
                    f"backend id {bid!r} is served by two installed backends, "
                    f"{sel.labels[bid]!r} and {info.name!r}; choose one with "
                    "backends=[...] (CLI: --backend)"
                )
            impl = load_backend(info.name)
            if getattr(impl, "name", None) != bid:  # a generic backend registered under the id
                impl = serving(impl, bid, info.name)
            sel.impls[bid] = impl
            sel.labels[bid] = info.name
            log.info(
                "backend id %r: installed backend %s (default selection)", bid, info.describe()
            )
    for bid in ids:
        if bid not in sel.impls:
            log.info("backend id %r: no installed backend serves it", bid)
    return sel


def resolve_backends(backends: Iterable[BackendLike] | None, ids: list[str]) -> Selection:
    """Map backend ids of the program to implementations.

    ``backends=None`` takes every installed backend whose ``name`` is an id of the
    program. Otherwise each given implementation serves its ``name``, and one generic
    (``name == "*"``) implementation serves every id left.
    """
    if backends is None:
        return _default(ids)
    sel = Selection(explicit=True)
    wildcard: tuple[BackendInterface, str] | None = None
    for spec in backends:
        impl = load_backend(spec)
        label = backend_label(spec)
        # a property of backend code: its failure (a sys.exit() too) is the backend's
        name = guarded(label, "reading its name", getattr, impl, "name", None)
        if name is None:
            raise ConfigurationError(
                f"backend {label!r} has no name: set the class attribute name to the "
                "BackendDelegate.id it serves (name = 'XnnpackBackend'), or to '*' to serve "
                "every id without a dedicated implementation (or give it as "
                f"'{label}@BACKEND_ID')"
            )
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"backend {label!r} has no usable name: {name!r}")
        sel.given.append((label, name))
        if isinstance(impl, PassthroughBackend) and (name == "*" or name in ids):
            sel.passthrough_requested = True  # not when it serves no id (a typo?)
        if name == "*":
            if wildcard is not None:
                raise ConfigurationError(
                    f"two generic backends given ({wildcard[1]!r} and {label!r}); "
                    "use NAME@BACKEND_ID to choose which id each serves"
                )
            wildcard = (impl, label)
        elif name in sel.impls:
            raise ConfigurationError(
                f"two implementations given for backend id {name!r}: "
                f"{sel.labels[name]!r} and {label!r}"
            )
        else:
            sel.impls[name] = impl
            sel.labels[name] = label
    sel.unused = sorted(name for name in sel.impls if name not in ids)
    for name in sel.unused:
        log.info(
            "backend %s serves %r, which is no backend id of the program", sel.labels[name], name
        )
    if wildcard is not None:
        for bid in ids:
            if bid not in sel.impls:
                sel.impls[bid] = wildcard[0]
                sel.labels[bid] = wildcard[1]
    for bid in ids:
        log.info("backend id %r: %s", bid, sel.labels.get(bid, "no implementation given"))
    return sel


def why_unchanged(
    sel: Selection,
    reports: list[BackendReport],
    *,
    has_ptd: bool,
    pte_has_named_data: bool,
    ptd_spelling: tuple[str, str] = SPECIALIZE_PTD,
) -> tuple[str | None, str | None]:
    """``(reason, hint)`` when no backend specialized anything, ``(None, None)`` when
    one did or when ``passthrough`` was named explicitly (a deliberate copy); a .ptd to
    pass is named in ``ptd_spelling``, the run's (:func:`~.report.pass_ptd`)."""
    if sel.passthrough_requested or any(r.status == "specialized" for r in reports):
        return None, None
    hints: list[str] = []
    if not reports:
        reason = "the program has no delegates, so no backend has anything to do"
    elif all(r.status == "no_implementation" for r in reports):
        if sel.explicit:
            given = ", ".join(
                f"{label} (serves {'any id' if serves == '*' else repr(serves)})"
                for label, serves in sel.given
            )
            reason = f"the backends given serve no backend id of the program: {given or 'none'}"
            ids = [r.backend_id for r in reports]
            for _, serves in sel.given:
                guess = did_you_mean(serves, ids)
                if serves != "*" and guess:
                    hints.append(f"No delegate has backend id {serves!r}{guess}.")
            hints.append("Use SPEC@BACKEND_ID to make a backend serve a given id.")
        else:
            reason = "no installed backend serves a backend id of the program"
            hints.append(
                "Install or register a backend whose name is one of these ids, or name "
                "one explicitly (backends=[...]; CLI: --backend)."
            )
    else:
        parts = [
            f"{r.backend_id!r}: "
            + (
                "no implementation"
                if r.status == "no_implementation"
                else f"{r.implementation} declined: {r.reason or 'NotSupported'}"
            )
            for r in reports
        ]
        lead = (
            "every backend declined"
            if all(r.status == "not_supported" for r in reports)
            else "no backend specialized anything"
        )
        reason = f"{lead} ({'; '.join(parts)})"
    if reports and not has_ptd and not pte_has_named_data:
        hints.append(no_named_data_hint(ptd_spelling))
    return reason, " ".join(hints) or None
