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

With no backends given, a run uses every installed backend (registration or entry
point) whose ``name`` attribute is a backend id of the program, whatever the
registration or entry point is called; a generic backend (``name == "*"``) is used by
default only for an id equal to its registration name. :func:`installed_backends`
lists them with what each serves.

Backend code is user code: an import, a factory or a constructor that fails with
anything but ``ImportError``/``TypeError`` (``SystemExit`` included; only
``KeyboardInterrupt`` passes through) raises :class:`~ptestore.errors.BackendError`
naming the spec; a module that cannot be imported raises
:class:`~ptestore.errors.ConfigurationError`.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING, Union

from .._dataclass import dataclass
from ..errors import BackendError, ConfigurationError, describe_exception
from .api import BackendInterface
from .compat import distribution_version
from .entrypoints import (
    BUILTIN_BACKENDS,
    ENTRY_POINT_GROUP,
    ambiguity,
    entry_point_table,
    load_entry_point,
    shadowed,
)
from .versions import version_of, version_text

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "BackendLike",
    "InstalledBackend",
    "backend_label",
    "declared_backends",
    "did_you_mean",
    "installed_backends",
    "load_backend",
    "object_label",
    "register_backend",
    "registered_backends",
    "serving",
    "unregister_backend",
]

BackendFactory = Callable[..., BackendInterface]
BackendLike = Union[str, BackendInterface, type[BackendInterface]]  # noqa: UP007

_lock = threading.Lock()
_registry: dict[str, object] = {}


@dataclass(frozen=True)
class InstalledBackend:
    """One installed backend: a :func:`register_backend` registration or an entry point
    of the group ``ptestore.backends``."""

    #: The registered or entry-point name (what ``--backend`` / ``backends=[...]`` take).
    name: str
    #: The ``BackendDelegate.id`` it serves (its ``name`` attribute), or ``"*"`` for a
    #: generic backend, which is used by default only for an id equal to :attr:`name`.
    serves: str
    #: Where it comes from: ``package.module:attr``.
    spec: str
    #: ``"registered"`` or ``"entry point"``.
    origin: str
    #: The version the implementation reports (what provenance records): its declared
    #: ``version``, else the version of the distribution providing it; None for a
    #: factory function or when unknown.
    version: str | None = None
    #: Why it could not be loaded (None when it loaded).
    error: str | None = None

    def serves_id(self, backend_id: str) -> bool:
        """Whether the default selection uses it for ``backend_id``."""
        if self.error is not None:
            return False
        return self.serves == backend_id or (self.serves == "*" and self.name == backend_id)

    def describe(self) -> str:
        """``"name (spec, serves ID)"`` for messages."""
        if self.error is not None:
            return f"{self.name} ({self.spec}, cannot be loaded: {self.error})"
        serves = "any id it is named for" if self.serves == "*" else repr(self.serves)
        return f"{self.name} ({self.spec}, serves {serves})"


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


def _entry_points() -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points  # a few ms to import: only when asked

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_backends() -> MappingProxyType[str, object]:
    """A read-only view of explicit registrations plus entry-point names (entry points
    appear as their unloaded ``EntryPoint`` objects)."""
    merged: dict[str, object] = dict(_entry_points())
    with _lock:
        merged.update(_registry)
    return MappingProxyType(merged)


def object_label(obj: object) -> str:
    """``package.module:QualName`` of a class or function, or of an instance's class;
    never a ``repr`` (which may show an address, or raise)."""
    import types  # what inspect.isroutine checks, without importing inspect (6 ms)

    routines = (
        types.FunctionType,
        types.BuiltinFunctionType,
        types.MethodType,
        types.MethodDescriptorType,
        types.WrapperDescriptorType,
        types.MethodWrapperType,
        types.ClassMethodDescriptorType,
    )
    target = obj if isinstance(obj, (type, *routines)) else type(obj)
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", "?")
    return f"{module}:{qualname}"


def backend_label(spec: BackendLike) -> str:
    """How reports and messages name a backend: the SPEC string as given, or
    ``package.module:QualName`` for a class or an instance."""
    if isinstance(spec, str):
        return spec.strip()
    given = getattr(spec, "__dict__", {}).get(SPEC_ATTRIBUTE)  # loaded from a SPEC
    return given if isinstance(given, str) else object_label(spec)


#: Instance attribute naming the SPEC an instance was loaded from (set by the
#: provenance stamper, which loads each SPEC once), so messages name it as given.
SPEC_ATTRIBUTE = "_ptestore_spec"


def _served(obj: object) -> str:
    """The id a registered object serves: its ``name`` when that is a concrete id
    (a class attribute for a class; a factory may carry one too), else ``"*"``."""
    try:
        name = getattr(obj, "name", None)
    except KeyboardInterrupt:
        raise
    except BaseException:  # a hostile property (a sys.exit() too): treat as generic
        name = None
    return name if isinstance(name, str) and name and name != "*" else "*"


def _declared_version(obj: object, name: str) -> str | None:
    """The version a registered object reports, as provenance records it
    (:func:`~.versions.version_text`: ``version = 2`` is ``"2"``): an instance's
    ``version``, a class's ``version`` class attribute (or, for a property, the default:
    its distribution's version); None for a factory function, which cannot be asked
    without calling it, or for a version that cannot be read or recorded."""
    try:
        if isinstance(obj, BackendInterface):
            return version_of(obj, name)
        if isinstance(obj, type) and issubclass(obj, BackendInterface):
            import inspect

            declared = inspect.getattr_static(obj, "version", property())
            if hasattr(type(declared), "__get__"):  # a property: read only on an instance
                return distribution_version(obj)
            return version_text(declared, name)
    except Exception:  # a hostile property: no version rather than no listing
        return None
    return None


def installed_backends() -> list[InstalledBackend]:
    """Every installed backend, registrations first, then entry points (an entry point
    shadowed by a registration of the same name is left out). Entry points are loaded
    to learn what they serve; one that cannot be loaded is listed with its error, and so
    is each declaration of a name several distributions declare (ambiguous) and another
    distribution's entry point named as a built-in (never used: the built-in keeps the
    name)."""
    with _lock:
        registered = dict(_registry)
    out = [
        InstalledBackend(
            name, _served(obj), object_label(obj), "registered", _declared_version(obj, name)
        )
        for name, obj in sorted(registered.items())
    ]
    for name, declarations in sorted(entry_point_table().items()):
        if name in registered:
            continue
        if len(declarations) > 1:
            why = ambiguity(name, declarations)
            out.extend(
                InstalledBackend(name, "*", d.value, "entry point", d.version, why)
                for d in declarations
            )
            continue
        value, version = declarations[0].value, declarations[0].version
        try:
            obj = load_entry_point(value, name)
        except (ConfigurationError, BackendError) as exc:
            out.append(InstalledBackend(name, "*", value, "entry point", version, str(exc)))
            continue
        # what provenance records (the class's version, or its own distribution's); the
        # declaring distribution's only for a factory, which cannot be asked
        loaded = _declared_version(obj, name)
        out.append(InstalledBackend(name, _served(obj), value, "entry point", loaded or version))
    for name, d, why in shadowed():  # listed, never used: the built-in keeps its name
        out.append(InstalledBackend(name, "*", d.value, "entry point", d.version, why))
    return out


def declared_backends() -> list[str]:
    """The installed backends as a message lists them, from what is known without
    importing any module: each registration as ``name (spec, serves ID)`` (its object
    is in memory), each entry-point declaration as ``name (module:attr)`` (from the
    metadata; what it serves would need its import, and a vendor's import-time code
    has no business running for an error message)."""
    with _lock:
        registered = dict(_registry)
    out = [
        InstalledBackend(name, _served(obj), object_label(obj), "registered").describe()
        for name, obj in sorted(registered.items())
    ]
    for name, declarations in sorted(entry_point_table().items()):
        if name not in registered:
            out.extend(f"{name} ({d.value})" for d in declarations)
    return out


def _guarded(what: str, spec: str, action: Callable[[], object]) -> object:
    """Run user code (an import, a factory): ``ImportError`` becomes a
    :class:`ConfigurationError`, any other exception (``SystemExit`` included, but not
    ``KeyboardInterrupt``) a :class:`BackendError`."""
    try:
        return action()
    except (ConfigurationError, BackendError, KeyboardInterrupt):
        raise
    except ImportError as exc:
        raise ConfigurationError(
            f"backend {spec!r}: {what} failed: {describe_exception(exc)}"
        ) from exc
    except BaseException as exc:  # backend code is user code
        raise BackendError(f"{what} failed: {describe_exception(exc)}", backend=spec) from exc


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, else ``""``."""
    import difflib  # only for an error message

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _import_path(ref: str, spec: str) -> object:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"backend {spec!r}: expected package.module:attr")
    if module_name.startswith("."):  # import_module raises TypeError: not the backend's
        raise ConfigurationError(
            f"backend {spec!r}: {module_name!r} is a relative module name; give the "
            "absolute one (package.module:attr), importable from sys.path"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"backend {spec!r}: cannot import {module_name!r}: {exc}") from exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a module's import-time code is user code
        raise BackendError(
            f"importing module {module_name!r} failed: {describe_exception(exc)}", backend=spec
        ) from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                around = [n for n in dir(obj) if not n.startswith("_")]
            except Exception:  # a hostile __dir__: no suggestion
                around = []
            raise ConfigurationError(
                f"backend {spec!r}: module {module_name!r} has no attribute {attr!r}"
                + did_you_mean(part, around)
            ) from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a module __getattr__ is user code
            raise BackendError(
                f"reading {attr!r} of module {module_name!r} failed: {describe_exception(exc)}",
                backend=spec,
            ) from exc
    return obj


def _resolve(ref: str, spec: str) -> object:
    if ":" in ref:
        return _import_path(ref, spec)
    with _lock:
        if ref in _registry:
            return _registry[ref]
    if ref in BUILTIN_BACKENDS:
        return load_entry_point(BUILTIN_BACKENDS[ref], spec)
    eps = entry_point_table()
    if ref in eps:
        if len(eps[ref]) > 1:
            raise ConfigurationError(f"backend {spec!r}: {ambiguity(ref, eps[ref])}")
        return load_entry_point(eps[ref][0].value, spec)
    known = sorted(set(eps) | set(_registry))
    raise ConfigurationError(
        f"backend {spec!r}: unknown name {ref!r}{did_you_mean(ref, known)}; known: "
        f"{', '.join(known) or 'none'} (or give an import path package.module:attr)"
    )


def _instantiate(obj: object, argument: str | None, spec: str) -> BackendInterface:
    label = object_label(obj)
    if isinstance(obj, BackendInterface):
        if argument is not None:
            raise ConfigurationError(
                f"backend {spec!r}: {label} is an instance and takes no =ARGUMENT"
            )
        return obj
    if not callable(obj):
        raise ConfigurationError(f"backend {spec!r}: {label} is not a backend or factory")

    def make() -> object:
        try:
            return obj() if argument is None else obj(argument)
        except TypeError as exc:
            raise ConfigurationError(
                f"backend {spec!r}: cannot construct {label}: {describe_exception(exc)}"
            ) from exc

    made = _guarded(f"constructing {label}", spec, make)
    if not isinstance(made, BackendInterface):
        raise ConfigurationError(
            f"backend {spec!r}: {label} returned {type(made).__name__}, not a BackendInterface"
        )
    return made


def load_backend(spec: BackendLike) -> BackendInterface:
    """Turn a SPEC string, a class or an instance into a backend instance."""
    if isinstance(spec, BackendInterface):
        return spec
    if isinstance(spec, type):
        return _instantiate(spec, None, object_label(spec))
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
        return serving(backend, backend_id.strip(), text)
    return backend


def serving(backend: BackendInterface, backend_id: str, spec: str) -> BackendInterface:
    """A copy of ``backend`` that serves ``backend_id`` (a shared, registered instance
    is never renamed)."""

    def rename() -> BackendInterface:
        import copy

        renamed = copy.copy(backend)
        renamed.name = backend_id
        return renamed

    made = _guarded(f"making {object_label(backend)} serve {backend_id!r}", spec, rename)
    assert isinstance(made, BackendInterface)
    return made
