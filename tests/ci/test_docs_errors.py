"""docs/concepts.md's error table names every public exception class of
``ptestore/errors.py`` (PermissionDenied, LockTimeout, AlreadySpecialized,
MissingNamedData and PackedWeightsRefused were missing), each with the standard classes
it also is."""

from __future__ import annotations

import re
from pathlib import Path

import ptestore.errors as errors

CONCEPTS = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"


def _rows() -> dict[str, str]:
    """The error table's rows: class name -> its "also a" cell."""
    text = CONCEPTS.read_text()
    table = text[text.index("## Errors") :].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3:
            for name in re.findall(r"`(\w+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_every_public_error_has_a_row_saying_what_else_it_is() -> None:
    rows = _rows()
    public = [
        n for n in errors.__all__ if isinstance(getattr(errors, n), type) and n != "PteStoreError"
    ]
    assert [n for n in public if n not in rows] == []
    for name in public:
        cls = getattr(errors, name)
        builtin = [
            b.__name__
            for b in cls.__mro__[1:]
            if b.__module__ == "builtins" and b not in (Exception, BaseException, object)
        ]
        named = re.findall(r"`(\w+)`", rows[name])
        # the nearest standard class is named (an OSError subclass may name OSError's own
        # subclass only, e.g. FileNotFoundError)
        assert not builtin or any(b in named for b in builtin), (name, builtin, rows[name])
