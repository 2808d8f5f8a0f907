"""A backend's version as ptestore records and lists it, and the checks every string
provenance records of a backend shares (its version, its SPEC, its
``compatibility_info``): valid UTF-8 (provenance is JSON) and a size limit.

- :func:`version_text`: the one conversion of a ``version`` value (``str()``, checked),
  for the record (:func:`version_of`) and the listing (``installed_backends``) alike;
- :func:`version_of`: an implementation's version, read from its ``version``;
- :func:`unrecordable`: why a string cannot be recorded, or None.
"""

from __future__ import annotations

from typing import Any

from ..errors import BackendError
from .guard import guarded

__all__ = ["MAX_SPEC", "MAX_VERSION", "unrecordable", "version_of", "version_text"]

#: The longest ``version`` a backend may report (UTF-8 bytes). A version names a build
#: (a PEP 440 version, a ``git describe``, an SDK's build id: tens of bytes); it is
#: compared wherever staleness is decided and recorded twice in every trailer
#: (``requested`` and ``backends``) and in each entry of a fleet index, so it is kept
#: short: long build details belong in ``compatibility_info`` (64 KiB).
MAX_VERSION = 1024
#: The longest SPEC text provenance records (UTF-8 bytes), as ``compatibility_info``'s
#: limit: a ``command=...`` SPEC carries a whole command line.
MAX_SPEC = 64 * 1024

_VERSION_LIMIT = (
    "a version names a build and is recorded in every artifact; put build details in "
    "compatibility_info"
)


def unrecordable(text: str, what: str, limit: int, why: str) -> str | None:
    """Why provenance cannot record ``text``, or None: a message led by ``what`` (as
    ``"compatibility_info returned"``): ``"... text that is not valid UTF-8 (character
    '\\udcff' at index 3); ..."`` or ``"... 70000 bytes; the limit is 65536 (why)"``."""
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{what} text that is not valid UTF-8 (character {text[exc.start]!r} at index "
            f"{exc.start}); provenance records it as JSON"
        )
    if len(encoded) > limit:
        return f"{what} {len(encoded)} bytes; the limit is {limit} ({why})"
    return None


def version_text(value: object, backend: str) -> str:
    """What ptestore records and lists for a ``version`` value: ``str(value)`` (an int,
    a tuple or a ``packaging`` Version as it prints); a ``__str__`` that raises, text
    that is not valid UTF-8 or longer than :data:`MAX_VERSION` is a
    :class:`~ptestore.errors.BackendError` naming ``backend``."""
    text = guarded(backend, "reading its version", str, value)  # backend code
    problem = unrecordable(text, "its version is", MAX_VERSION, _VERSION_LIMIT)
    if problem is not None:
        raise BackendError(problem, backend=backend)
    return text


def version_of(impl: Any, backend: str) -> str:
    """:func:`version_text` of a backend implementation's ``version``; a ``version``
    property that raises (or exits: :func:`~.guard.guarded`) is a
    :class:`~ptestore.errors.BackendError` naming ``backend``
    (its id or SPEC), wherever a version is read (provenance, a fleet plan, a worker's
    check, ``verify --job``, the device cache's key). A run reads it once per
    implementation (:class:`~ptestore.provenance.stamp.Stamper`)."""
    value = guarded(backend, "reading its version", getattr, impl, "version")
    return version_text(value, backend)
