"""The entry points of the group ``ptestore.backends``: which distribution declares
which name (a name two distributions declare is ambiguous, and refused by name), and
loading one as ``EntryPoint.load`` does.

Read from the installed metadata, or from the active snapshot (:mod:`.snapshot`)
when it has them; ptestore's own backends (:data:`BUILTIN_BACKENDS`) resolve without
reading any metadata.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import NamedTuple

from ..errors import BackendError, ConfigurationError, describe_exception
from .snapshot import active as active_snapshot

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "Declaration",
    "ambiguity",
    "entry_point_table",
    "load_entry_point",
    "shadowed",
]

ENTRY_POINT_GROUP = "ptestore.backends"

#: ptestore's own backends: the entry points its distribution declares (pyproject.toml,
#: checked by a test), resolved by name without reading any installed metadata
#: (:mod:`importlib.metadata` and the entry points of every distribution cost tens of ms
#: at start-up). A third party's entry point of the same name does not replace them.
BUILTIN_BACKENDS: MappingProxyType[str, str] = MappingProxyType(
    {
        "passthrough": "ptestore.backends.passthrough:PassthroughBackend",
        "command": "ptestore.backends.command:CommandBackend",
    }
)


class Declaration(NamedTuple):
    """One entry point of the group: what it names and who declares it."""

    #: ``module:attr`` (as declared, extras included).
    value: str
    #: The version of the distribution declaring it (None when unknown).
    version: str | None
    #: The name of the distribution declaring it (None when unknown).
    distribution: str | None

    def describe(self) -> str:
        """``acme_plugin 1.2 (acme_npu.ptestore:Npu)``."""
        who = " ".join(p for p in (self.distribution, self.version) if p) or "unknown"
        return f"{who} ({self.value})"


def ambiguity(name: str, declarations: list[Declaration]) -> str:
    """Why an entry-point name that several distributions declare is refused."""
    listed = ", ".join(d.describe() for d in declarations[:-1])
    return (
        f"the entry point name {name!r} (group {ENTRY_POINT_GROUP}) is declared by "
        f"{len(declarations)} distributions, {listed} and {declarations[-1].describe()}: "
        "which one is meant is unknown; uninstall one, or name the class by its import "
        "path (package.module:attr)"
    )


def _read_installed() -> dict[str, list[Declaration]]:
    from importlib.metadata import entry_points  # a few ms to import: only when asked

    table: dict[str, list[Declaration]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        found = Declaration(
            ep.value,
            getattr(dist, "version", None) if dist is not None else None,
            getattr(dist, "name", None) if dist is not None else None,
        )
        same = table.setdefault(ep.name, [])
        if all(d.value != found.value for d in same):  # one class declared twice: one
            same.append(found)
    for same in table.values():  # the order of sys.path decides nothing
        same.sort(key=lambda d: (d.distribution or "", d.value))
    return table


def _declared() -> dict[str, list[Declaration]]:
    """Every declaration of the group, ptestore's own and those of other distributions
    under the same names included: from the active snapshot when it has them (no
    metadata read), else from the installed metadata (and then recorded in it)."""
    snap = active_snapshot()
    if snap is not None and snap.entry_points is not None:
        return {name: [Declaration(*d) for d in ds] for name, ds in snap.entry_points.items()}
    table = _read_installed()
    if snap is not None:
        snap.learn_entry_points({name: [(*d,) for d in ds] for name, ds in table.items()})
    return table


def entry_point_table() -> dict[str, list[Declaration]]:
    """Entry-point name -> its declarations (one, or several: ambiguous). A built-in's
    name is ptestore's backend alone, whatever else declares it (:func:`shadowed`)."""
    table = _declared()
    for name, value in BUILTIN_BACKENDS.items():  # ours, whatever else declares the name
        ours = [d for d in table.get(name, []) if d.value == value]
        table[name] = ours[:1] or [Declaration(value, None, None)]
    return table


def shadowed() -> list[tuple[str, Declaration, str]]:
    """Other distributions' entry points named as a built-in (``passthrough``,
    ``command``): ``(name, declaration, why it is not used)``. The built-in keeps the
    name (a plugin cannot replace what ``--backend passthrough`` means); listing them
    says so instead of dropping them silently."""
    table = _declared()
    return [
        (
            name,
            d,
            f"the name {name!r} is ptestore's built-in backend ({value}), which keeps it: "
            f"this entry point of {d.describe()} is not used; give it by its import path "
            f"({d.value.partition('[')[0].strip()}) or declare it under another name",
        )
        for name, value in BUILTIN_BACKENDS.items()
        for d in table.get(name, [])
        if d.value != value
    ]


def load_entry_point(value: str, spec: str) -> object:
    """Load an entry point's ``module:attr.attr [extras]`` value as
    ``EntryPoint.load`` does (extras are not checked, as there)."""

    module_name, _, attr = value.partition("[")[0].partition(":")
    module_name = module_name.strip()
    if not module_name or module_name.startswith("."):
        # import_module raises TypeError or ValueError: not the backend's code failing
        raise ConfigurationError(
            f"backend {spec!r}: entry point {value!r} names no absolute module "
            "(package.module:attr, importable from sys.path): its distribution declares "
            "it wrongly"
        )

    def load() -> object:
        obj: object = importlib.import_module(module_name)
        for part in attr.strip().split("."):
            if part:
                obj = getattr(obj, part)
        return obj

    try:
        return load()
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"backend {spec!r}: entry point {value!r} failed to load: {describe_exception(exc)}"
        ) from exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a module's import-time code is user code
        raise BackendError(
            f"entry point {value!r} failed to load: {describe_exception(exc)}", backend=spec
        ) from exc
