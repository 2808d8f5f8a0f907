"""The checks of a public call's arguments that Python's own errors would make
confusing: a path given as ``None``, an ``int`` or ``bytes`` (a bare ``TypeError`` from
deep inside, naming no argument), and a backend list given as one string (read
character by character: ``backend 'm': unknown name``), a flag given as ``"no"`` (which
is true), a device given as its name, a ``(src, dst)`` pair given as one string (split
into characters). Each is a
:class:`~ptestore.errors.ConfigurationError` naming the argument and what it got.
Standard library only (with ``ptestore.errors`` and ``ptestore._text``)."""

from __future__ import annotations

import os

from ._text import shown
from .errors import ConfigurationError

__all__ = [
    "backends_argument",
    "callable_argument",
    "device_argument",
    "flag_argument",
    "flag_arguments",
    "pair_argument",
    "path_argument",
    "path_arguments",
    "text_arguments",
]


def path_argument(value: object, name: str) -> str:
    """``value``, a path or URL (a ``str``, or an ``os.PathLike`` giving one), as a
    ``str``; anything else is a :class:`ConfigurationError` naming the argument."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        text = os.fspath(value)
        if isinstance(text, str):
            return text
        got = f"an os.PathLike giving {type(text).__name__} {shown(text)}"
    elif value is None:
        got = "None"
    else:
        got = f"{type(value).__name__} {shown(value)}"
    raise ConfigurationError(f"{name} must be a path or URL (a str or os.PathLike), got {got}")


def path_arguments(**values: object) -> None:
    """:func:`path_argument` for each of ``values`` that is not None (optional paths)."""
    for name, value in values.items():
        if value is not None:
            path_argument(value, name)


def backends_argument(backends: object) -> None:
    """Refuse ``backends`` given as one string (or bytes), which iterating would read
    as one backend per character: a list of SPECs or objects is what it takes."""
    if isinstance(backends, (str, bytes)):
        raise ConfigurationError(
            f"backends must be a list of backend SPECs or objects, got the "
            f"{type(backends).__name__} {shown(backends)} (iterated, it would be read an "
            f"item at a time, each character a backend): pass backends=[{shown(backends)}]"
        )


def flag_argument(value: object, name: str) -> None:
    """Refuse a flag that is not ``True`` or ``False`` (``"no"`` would be read as true)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {shown(value)}")


def flag_arguments(**values: object) -> None:
    """:func:`flag_argument` for each of ``values``."""
    for name, value in values.items():
        flag_argument(value, name)


def text_arguments(**values: object) -> None:
    """Refuse each of ``values`` that is neither a ``str`` nor None (a fingerprint given
    as a number would be compared as one, and never match)."""
    for name, value in values.items():
        if value is not None and not isinstance(value, str):
            raise ConfigurationError(
                f"{name} must be a str or None, got {type(value).__name__} {shown(value)}"
            )


def callable_argument(value: object, name: str) -> None:
    """Refuse a callback that is neither callable nor None (called later, it would be a
    bare ``TypeError`` in the middle of the run)."""
    if value is not None and not callable(value):
        raise ConfigurationError(
            f"{name} must be a callable or None, got {type(value).__name__} {shown(value)}"
        )


def device_argument(
    device: object,
    profile: type | tuple[type, ...],
    hint: str | None = None,
    what: str | None = None,
) -> None:
    """Refuse a ``device`` that is not a ``profile`` (the caller's ``DeviceProfile``
    class: this floor imports no backend; with ``str``, a device's name too) or None; a
    name alone gets ``hint`` (default: make a profile of it)."""
    if what is None:
        named = isinstance(profile, tuple) and str in profile
        what = "a DeviceProfile, a device's name or None" if named else "a DeviceProfile or None"
    if device is not None and not isinstance(device, profile):
        if hint is None:
            hint = f" {shown(device)}: pass DeviceProfile({shown(device)})"
        raise ConfigurationError(
            f"device must be {what}, got {type(device).__name__}"
            + (hint if isinstance(device, str) else f" {shown(device)}")
        )


def pair_argument(value: object, name: str, what: str) -> tuple[object, object]:
    """The two items of ``value``, a ``(src, dst)`` pair (a tuple or list of two; each
    item the caller checks as a path): a string alone (iterated, split into characters),
    one item or three is a :class:`ConfigurationError` naming the argument."""
    if isinstance(value, (str, bytes, os.PathLike)):
        raise ConfigurationError(
            f"{name} is a {what} pair, got the {type(value).__name__} {shown(value)} alone: "
            f"pass {name}=(SRC, DST)"
        )
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        if isinstance(value, (tuple, list)):
            got = f"{len(value)} item{'' if len(value) == 1 else 's'}: {shown(value)}"
        else:
            got = f"{type(value).__name__} {shown(value)}"
        raise ConfigurationError(
            f"{name} is a {what} pair (a tuple of two paths or URLs), got {got}"
        )
    return value[0], value[1]
