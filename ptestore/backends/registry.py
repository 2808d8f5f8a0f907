"""Finding backend implementations: registered names, entry points, import paths.

A backend SPEC (the CLI's ``--backend`` value, or a string in ``backends=[...]``) is::

    REF[@BACKEND_ID][=ARGUMENT]

- ``REF`` is a registered name (``register_backend``), a name from the entry-point
  group ``ptestore.backends``, or an import path ``package.module:attr``;
- ``@BACKEND_ID`` makes the implementation serve that ``BackendDelegate.id`` (useful for
  generic backends such as ``passthrough`` and ``command``, which otherwise serve every
  id that has no dedicated implementation);
- ``=ARGUMENT`` is a string handed to the factory (for ``command``: the command line).

Examples: ``passthrough``, ``mypkg.xnn:XnnpackPacker``,
``command@XnnpackBackend=python3 pack.py --level 2``.
"""

from __future__ import annotations

import copy
import importlib
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, Union

from ..errors import ConfigurationError
from .api import BackendInterface

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendLike",
    "load_backend",
    "register_backend",
    "registered_backends",
    "unregister_backend",
]

ENTRY_POINT_GROUP = "ptestore.backends"

BackendFactory = Callable[..., BackendInterface]
BackendLike = Union[str, BackendInterface, type[BackendInterface]]  # noqa: UP007

_lock = threading.Lock()
_registry: dict[str, object] = {}


def register_backend(
    backend: BackendInterface | type[BackendInterface] | BackendFactory,
    name: str | None = None,
    *,
    replace: bool = False,
) -> None:
    """Register a backend implementation (an instance, a class or a factory) under
    ``name`` (default: its ``name`` attribute). Refuses to replace an existing
    registration unless ``replace=True``."""
    if name is None:
        name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name or name == "*":
        raise ConfigurationError(
            f"register_backend: a name is required for {backend!r} (got {name!r})"
        )
    with _lock:
        if name in _registry and not replace and _registry[name] is not backend:
            raise ConfigurationError(
                f"register_backend: {name!r} is already registered "
                f"({_registry[name]!r}); pass replace=True to override"
            )
        _registry[name] = backend


def unregister_backend(name: str) -> None:
    """Remove a registration made with :func:`register_backend` (no error if absent)."""
    with _lock:
        _registry.pop(name, None)


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_backends() -> MappingProxyType[str, object]:
    """A read-only view of explicit registrations plus entry-point names (entry points
    appear as their unloaded ``EntryPoint`` objects)."""
    merged: dict[str, object] = dict(_entry_points())
    with _lock:
        merged.update(_registry)
    return MappingProxyType(merged)


def _import_path(ref: str, spec: str) -> object:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"backend {spec!r}: expected package.module:attr")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"backend {spec!r}: cannot import {module_name!r}: {exc}") from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(
                f"backend {spec!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    return obj


def _resolve(ref: str, spec: str) -> object:
    if ":" in ref:
        return _import_path(ref, spec)
    with _lock:
        if ref in _registry:
            return _registry[ref]
    eps = _entry_points()
    if ref in eps:
        try:
            return eps[ref].load()
        except Exception as exc:
            raise ConfigurationError(
                f"backend {spec!r}: entry point {eps[ref].value!r} failed to load: {exc}"
            ) from exc
    known = sorted(set(eps) | set(_registry))
    raise ConfigurationError(
        f"backend {spec!r}: unknown name {ref!r}; known: {', '.join(known) or 'none'} "
        "(or give an import path package.module:attr)"
    )


def _instantiate(obj: object, argument: str | None, spec: str) -> BackendInterface:
    if isinstance(obj, BackendInterface):
        if argument is not None:
            raise ConfigurationError(
                f"backend {spec!r}: {obj!r} is an instance and takes no =ARGUMENT"
            )
        return obj
    if not callable(obj):
        raise ConfigurationError(f"backend {spec!r}: {obj!r} is not a backend or factory")
    try:
        made = obj() if argument is None else obj(argument)
    except ConfigurationError:
        raise
    except TypeError as exc:
        raise ConfigurationError(f"backend {spec!r}: cannot construct {obj!r}: {exc}") from exc
    if not isinstance(made, BackendInterface):
        raise ConfigurationError(
            f"backend {spec!r}: {obj!r} returned {type(made).__name__}, not a BackendInterface"
        )
    return made


def load_backend(spec: BackendLike) -> BackendInterface:
    """Turn a SPEC string, a class or an instance into a backend instance."""
    if isinstance(spec, BackendInterface):
        return spec
    if isinstance(spec, type):
        return _instantiate(spec, None, spec.__name__)
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigurationError(f"backend spec must be a non-empty string, got {spec!r}")
    text = spec.strip()
    ref, eq, argument = text.partition("=")
    ref, at, backend_id = ref.partition("@")
    ref = ref.strip()
    if at and not backend_id.strip():
        raise ConfigurationError(f"backend {spec!r}: empty backend id after '@'")
    backend = _instantiate(_resolve(ref, text), argument if eq else None, text)
    if at:
        backend = copy.copy(backend)  # never rename a shared, registered instance
        backend.name = backend_id.strip()
    return backend
