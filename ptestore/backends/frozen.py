"""Read-only JSON values: a :class:`~.compat.DeviceProfile`'s options, which a profile
keeps as a deeply read-only copy (its digest is recorded with what it made, and a
backend gets the caller's own profile as ``context.device``).

:class:`FrozenDict` and :class:`FrozenList` are ``dict`` and ``list`` subclasses, so the
options still compare equal to plain dicts and lists, serialize as JSON objects and
arrays, and pickle (a Dask worker gets them frozen again); every method that would change
one raises ``TypeError`` saying so (``device options are read-only: setdefault('threads',
...) would change the profile ...``). ``copy.copy`` and ``copy.deepcopy`` give plain,
mutable copies (shallow and deep): what a backend that wants to change them starts from.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["FrozenDict", "FrozenList", "freeze", "thaw"]


def _refuse(what: str) -> NoReturn:
    raise TypeError(
        f"device options are read-only: {what} would change the profile, whose digest is "
        "recorded with what it made; make a new DeviceProfile(name, {**profile.options, ...}) "
        "or change a copy (copy.deepcopy(profile.options) is a plain dict)"
    )


def _arg(args: tuple[Any, ...]) -> str:
    return repr(args[0]) + (", ..." if len(args) > 1 else "") if args else ""


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses every change (see the module docstring)."""

    __slots__ = ()

    def __setitem__(self, key: str, value: Any) -> NoReturn:
        _refuse(f"[{key!r}] = ...")

    def __delitem__(self, key: str) -> NoReturn:
        _refuse(f"del [{key!r}]")

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("|=")

    def setdefault(self, *args: Any) -> NoReturn:
        _refuse(f"setdefault({_arg(args)})")

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("update(...)")

    def pop(self, *args: Any) -> NoReturn:
        _refuse(f"pop({_arg(args)})")

    def popitem(self) -> NoReturn:
        _refuse("popitem()")

    def clear(self) -> NoReturn:
        _refuse("clear()")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled frozen (not item by item)
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return thaw(self)  # type: ignore[no-any-return]


class FrozenList(list[Any]):
    """A ``list`` that refuses every change (see the module docstring)."""

    __slots__ = ()

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        _refuse(f"[{index!r}] = ...")

    def __delitem__(self, index: Any) -> NoReturn:
        _refuse(f"del [{index!r}]")

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("+=")

    def __imul__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse("*=")

    def append(self, value: Any) -> NoReturn:
        _refuse(f"append({value!r})")

    def extend(self, values: Any) -> NoReturn:
        _refuse("extend(...)")

    def insert(self, index: Any, value: Any) -> NoReturn:
        _refuse(f"insert({index!r}, ...)")

    def remove(self, value: Any) -> NoReturn:
        _refuse(f"remove({value!r})")

    def pop(self, *args: Any) -> NoReturn:
        _refuse(f"pop({_arg(args)})")

    def clear(self) -> NoReturn:
        _refuse("clear()")

    def sort(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("sort()")

    def reverse(self) -> NoReturn:
        _refuse("reverse()")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return thaw(self)  # type: ignore[no-any-return]


def freeze(value: Any) -> Any:
    """A JSON value with every object and array made read-only (a copy; the options
    nest at most ``MAX_OPTIONS_DEPTH`` levels: the recursion is bounded)."""
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of a JSON value :func:`freeze` made."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    return value
