"""The checks of a public call's arguments that Python's own errors would make
confusing: a path given as ``None``, an ``int`` or ``bytes`` (a bare ``TypeError`` from
deep inside, naming no argument), and a backend list given as one string (read
character by character: ``backend 'm': unknown name``). Each is a
:class:`~ptestore.errors.ConfigurationError` naming the argument and what it got.
Standard library only (with ``ptestore.errors`` and ``ptestore._text``)."""

from __future__ import annotations

import os

from ._text import shown
from .errors import ConfigurationError

__all__ = ["backends_argument", "path_argument"]


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


def backends_argument(backends: object) -> None:
    """Refuse ``backends`` given as one string (or bytes), which iterating would read
    as one backend per character: a list of SPECs or objects is what it takes."""
    if isinstance(backends, (str, bytes)):
        raise ConfigurationError(
            f"backends must be a list of backend SPECs or objects, got the "
            f"{type(backends).__name__} {shown(backends)} (iterated, it would be read an "
            f"item at a time, each character a backend): pass backends=[{shown(backends)}]"
        )
