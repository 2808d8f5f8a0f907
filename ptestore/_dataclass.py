"""``dataclass``, ``field`` and ``replace``, as :mod:`dataclasses` declares them, without
importing it.

Start-up is a measured cost on devices. On Python 3.11 the standard decorator compiles
up to six small functions per class (one ``exec`` each: ``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, and ``__setattr__``/``__delattr__`` for a frozen class), and
``import dataclasses`` brings :mod:`inspect` with ``ast``, ``dis`` and ``tokenize``:
about 30 ms of the 43 classes an in-place run defines, a sixth of the run. Here a class
costs one ``exec`` (its ``__init__``, the same code the standard decorator writes, so an
instance costs what it costs there); ``__repr__``, ``__eq__``, ``__hash__`` and the
frozen guards are closures over its fields, compiled once for every class, with the
standard rules (the fields with ``repr``/``compare``/``hash`` set; the other object of
the same class only; ``__hash__`` for ``eq`` and ``frozen``, None for ``eq`` without
``frozen``, unless the class defines its own; a recursive ``__repr__`` shown as
``...``; a frozen instance refuses assignments with
:class:`dataclasses.FrozenInstanceError`).

:mod:`dataclasses` is imported only when something asks it about these classes:
``dataclasses.fields``, ``replace``, ``asdict``, ``is_dataclass`` (``__dataclass_fields__``
and ``__dataclass_params__`` are made on first access, by the standard decorator applied
to a shadow of the class: the same ``Field`` objects), or a frozen instance refuses an
assignment. What ptestore does not use is left to the standard decorator: ``order``,
``unsafe_hash``, ``slots``, ``kw_only``, ``init=False`` or ``match_args=False`` on the
class, ``InitVar`` and ``KW_ONLY`` fields, a base made by the standard decorator. One
difference: a class without a docstring keeps none (the standard one writes its
signature there, with :mod:`inspect`).

Type checkers see :func:`dataclasses.dataclass`, ``field`` and ``replace`` themselves.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__all__ = ["dataclass", "field", "replace"]


class _Sentinel:
    def __init__(self, shown: str) -> None:
        self.shown = shown

    def __repr__(self) -> str:
        return self.shown


#: No default (``dataclasses.MISSING`` where :mod:`dataclasses` is used).
_MISSING: Any = _Sentinel("MISSING")
#: The ``__init__`` parameter default of a field with a default factory.
_FACTORY: Any = _Sentinel("<factory>")

#: Class options handled here, with the standard defaults.
_OPTIONS = {"init": True, "repr": True, "eq": True, "frozen": False}


class Field:
    """One field, as :func:`field` declares it (and, once made, its ``name`` and
    ``type``)."""

    __slots__ = (
        "compare",
        "default",
        "default_factory",
        "hash",
        "init",
        "kw_only",
        "metadata",
        "name",
        "repr",
        "type",
    )

    def __init__(
        self,
        default: Any,
        default_factory: Any,
        init: bool,
        repr: bool,
        hash: bool | None,
        compare: bool,
        metadata: Any,
        kw_only: Any,
    ) -> None:
        self.name: str = ""
        self.type: Any = None
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.hash = hash
        self.compare = compare
        self.metadata = metadata
        self.kw_only = kw_only

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, init={self.init!r})"


def _is_missing(value: object) -> bool:
    return value is _MISSING or type(value).__name__ == "_MISSING_TYPE"


def _is_field(value: object) -> bool:
    """One of these fields, or a :class:`dataclasses.Field` (then already imported)."""
    return type(value) is Field or (
        type(value).__name__ == "Field" and type(value).__module__ == "dataclasses"
    )


if TYPE_CHECKING:
    from dataclasses import dataclass, field, replace
else:

    def field(
        *,
        default: Any = _MISSING,
        default_factory: Any = _MISSING,
        init: bool = True,
        repr: bool = True,
        hash: bool | None = None,
        compare: bool = True,
        metadata: Any = None,
        kw_only: Any = _MISSING,
    ) -> Any:
        if not _is_missing(default) and not _is_missing(default_factory):
            raise ValueError("cannot specify both default and default_factory")
        return Field(default, default_factory, init, repr, hash, compare, metadata, kw_only)

    def dataclass(cls: Any = None, /, **options: Any) -> Any:
        if cls is None:
            return lambda c: _make(c, options)
        return _make(cls, options)

    def replace(obj: Any, /, **changes: Any) -> Any:
        made = getattr(type(obj), "__ptestore_dataclass__", None)
        if made is None:
            import dataclasses

            return dataclasses.replace(obj, **changes)
        for f in made[0]:
            if not f.init:
                if f.name in changes:
                    raise ValueError(
                        f"field {f.name} is declared with init=False, it cannot be "
                        "specified with replace()"
                    )
            elif f.name not in changes:
                changes[f.name] = getattr(obj, f.name)
        return obj.__class__(**changes)


def _make(cls: type, options: dict[str, Any]) -> type:
    params = {**_OPTIONS, **options}
    fields = None if set(options) - set(_OPTIONS) or not params["init"] else _fields(cls)
    if fields is None:
        return _standard_decorator(cls, options)
    frozen, eq = bool(params["frozen"]), bool(params["eq"])
    for base in cls.__mro__[1:]:
        made = base.__dict__.get("__ptestore_dataclass__")
        if made is not None and made[1]["frozen"] != frozen:
            raise TypeError(
                "cannot inherit frozen dataclass from a non-frozen one"
                if frozen
                else "cannot inherit non-frozen dataclass from a frozen one"
            )
    own = cls.__dict__
    # as the standard decides it: a class that defines __eq__ alone has __hash__ None
    own_hash = own.get("__hash__", _MISSING)
    explicit_hash = not (own_hash is _MISSING or (own_hash is None and "__eq__" in own))
    setattr(cls, "__ptestore_dataclass__", (fields, params))  # noqa: B010 - a type
    for name in ("__dataclass_fields__", "__dataclass_params__"):
        setattr(cls, name, _Standard(name))
    if "__init__" not in own:
        _set(cls, _init(cls, fields, frozen))
    if params["repr"] and "__repr__" not in own:
        _set(cls, _repr([f.name for f in fields if f.repr]))
    if eq:
        compared = [f.name for f in fields if f.compare]
        if "__eq__" not in own:
            _set(cls, _eq(compared))
        if not explicit_hash:
            if frozen:
                hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
                _set(cls, _hash(hashed))
            else:
                setattr(cls, "__hash__", None)  # noqa: B010 - a type
    if frozen:
        for guard in ("__setattr__", "__delattr__"):
            if guard in own:
                raise TypeError(f"Cannot overwrite attribute {guard} in class {cls.__name__}")
        names = frozenset(f.name for f in fields)
        _set(cls, _frozen_setattr(cls, names))
        _set(cls, _frozen_delattr(cls, names))
    if "__match_args__" not in own:
        setattr(cls, "__match_args__", tuple(f.name for f in fields if f.init))  # noqa: B010
    return cls


def _fields(cls: type) -> list[Field] | None:
    """The class's fields in order (its bases' first), or None where the standard
    decorator must make it (a field or base this module does not handle)."""
    found: dict[str, Field] = {}
    for base in cls.__mro__[-1:0:-1]:
        if _standard_made(base):
            return None  # a base made by the standard decorator
        made = base.__dict__.get("__ptestore_dataclass__")
        if made is not None:
            for f in made[0]:
                found[f.name] = f
    # the class's own annotations (inspect.get_annotations would import inspect)
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
        kind = _kind(annotation)
        if kind == "classvar":
            continue
        if kind is not None:
            return None  # InitVar, KW_ONLY
        value = cls.__dict__.get(name, _MISSING)
        if _is_field(value):
            if not _is_missing(value.kw_only) and value.kw_only:
                return None
            f = Field(
                value.default,
                value.default_factory,
                value.init,
                value.repr,
                value.hash,
                value.compare,
                value.metadata,
                value.kw_only,
            )
            if _is_missing(f.default):
                f.default = _MISSING
            if _is_missing(f.default_factory):
                f.default_factory = _MISSING
        else:
            f = Field(value, _MISSING, True, True, None, True, None, _MISSING)
        f.name, f.type = name, annotation
        if f.default is not _MISSING and type(f.default).__hash__ is None:
            raise ValueError(
                f"mutable default {type(f.default)} for field {name} is not allowed: use "
                "default_factory"
            )
        found[name] = f
    fields = list(found.values())
    for f in fields:  # a field(...) leaves the class: its default stays, as the standard
        if _is_field(cls.__dict__.get(f.name)):
            if f.default is _MISSING:
                delattr(cls, f.name)
            else:
                setattr(cls, f.name, f.default)
    seen_default = False
    for f in fields:
        if not f.init:
            continue
        if f.default is _MISSING and f.default_factory is _MISSING:
            if seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            seen_default = True
    return fields


def _standard_made(base: type) -> bool:
    own = base.__dict__
    return "__dataclass_fields__" in own and "__ptestore_dataclass__" not in own


def _kind(annotation: object) -> str | None:
    """``classvar``, ``other`` (``InitVar``, ``KW_ONLY``) or None (a field)."""
    if isinstance(annotation, str):
        head = annotation.strip().split("[", 1)[0].strip().rsplit(".", 1)[-1]
        if head == "ClassVar":
            return "classvar"
        return "other" if head in ("InitVar", "KW_ONLY") else None
    typing = sys.modules.get("typing")
    if typing is not None and (
        annotation is typing.ClassVar or getattr(annotation, "__origin__", None) is typing.ClassVar
    ):
        return "classvar"
    module = type(annotation).__module__
    if module == "dataclasses" or getattr(annotation, "__module__", None) == "dataclasses":
        return "other"
    return None


def _standard_decorator(cls: type, options: dict[str, Any]) -> type:
    """The standard decorator, given standard fields for any made by :func:`field`."""
    import dataclasses

    for name, value in list(cls.__dict__.items()):
        if type(value) is Field:
            setattr(cls, name, _standard_field(value))
    made: type = dataclasses.dataclass(cls, **options)
    return made


def _standard_field(f: Field) -> Any:
    import dataclasses

    extra = {} if _is_missing(f.kw_only) else {"kw_only": f.kw_only}
    return dataclasses.field(
        default=dataclasses.MISSING if f.default is _MISSING else f.default,
        default_factory=(
            dataclasses.MISSING if f.default_factory is _MISSING else f.default_factory
        ),
        init=f.init,
        repr=f.repr,
        hash=f.hash,
        compare=f.compare,
        metadata=f.metadata,
        **extra,
    )


class _Standard:
    """``__dataclass_fields__`` or ``__dataclass_params__`` of a class made here, made
    on first access by the standard decorator on a shadow of it (fields of the same
    names, types, defaults and flags; the same class options), then set on the class."""

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj: object, owner: type) -> Any:
        import dataclasses

        cls = next(c for c in owner.__mro__ if c.__dict__.get(self.attr) is self)
        fields, params = cls.__dict__["__ptestore_dataclass__"]
        namespace: dict[str, Any] = {
            "__annotations__": {f.name: f.type for f in fields},
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
        }
        namespace.update((f.name, _standard_field(f)) for f in fields)
        shadow: type = dataclasses.dataclass(type(cls.__name__, (), namespace), **params)
        for attr in ("__dataclass_fields__", "__dataclass_params__"):
            setattr(cls, attr, shadow.__dict__[attr])
        return cls.__dict__[self.attr]


def _set(cls: type, fn: Any) -> None:
    fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
    fn.__module__ = cls.__module__
    setattr(cls, fn.__name__, fn)


def _init(cls: type, fields: list[Field], frozen: bool) -> Any:
    """``__init__``, compiled from the source the standard decorator writes."""
    self_name = "__dataclass_self__" if any(f.name == "self" for f in fields) else "self"
    env: dict[str, Any] = {"__object_setattr": object.__setattr__, "__FACTORY": _FACTORY}
    params, body = [self_name], []
    for f in fields:
        if f.init:
            if f.default_factory is not _MISSING:
                params.append(f"{f.name}=__FACTORY")
            elif f.default is not _MISSING:
                env[f"__d_{f.name}"] = f.default
                params.append(f"{f.name}=__d_{f.name}")
            else:
                params.append(f.name)
        if f.default_factory is not _MISSING:
            env[f"__f_{f.name}"] = f.default_factory
            value = (
                f"__f_{f.name}() if {f.name} is __FACTORY else {f.name}"
                if f.init
                else f"__f_{f.name}()"
            )
        elif f.init:
            value = f.name
        else:
            continue  # the class attribute (its default) is read
        if frozen:
            body.append(f"__object_setattr({self_name}, {f.name!r}, {value})")
        else:
            body.append(f"{self_name}.{f.name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append(f"{self_name}.__post_init__()")
    source = f"def __init__({', '.join(params)}):\n " + "\n ".join(body or ["pass"])
    exec(source, env)  # the source is made above from the class's field names
    fn = env["__init__"]
    fn.__annotations__ = {**{f.name: f.type for f in fields if f.init}, "return": None}
    return fn


def _repr(names: list[str]) -> Any:
    import reprlib

    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _values(names: list[str]) -> Any:
    from operator import attrgetter

    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


def _eq(names: list[str]) -> Any:
    values = _values(names)

    def __eq__(self: Any, other: object) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash(names: list[str]) -> Any:
    values = _values(names)

    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _frozen_error(message: str) -> BaseException:
    from dataclasses import FrozenInstanceError

    return FrozenInstanceError(message)


def _frozen_setattr(cls: type, names: frozenset[str]) -> Any:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise _frozen_error(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)  # type: ignore[arg-type]

    return __setattr__


def _frozen_delattr(cls: type, names: frozenset[str]) -> Any:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise _frozen_error(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)  # type: ignore[arg-type]

    return __delattr__
