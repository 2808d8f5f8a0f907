"""JSON of bounded nesting, shared by the readers of JSON that another process wrote
(a provenance trailer's record, a fleet index's objects).

Python's decoder recurses once per level of arrays and objects: text like
``"[" * 100000`` escapes as a ``RecursionError`` (not a ``ValueError``), and a value
nested a few hundred levels deep parses, then breaks the next recursive walk of it
(``copy.deepcopy``, ``json.dumps``). A reader bounds the levels instead
(:func:`load_bounded`) and refuses deeper text as a
:class:`~ptestore.errors.FormatError` naming the source, the field and the bound.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import FormatError

__all__ = ["bracket_depth", "json_depth", "load_bounded"]

#: A JSON string (the unrolled form: fast on long strings), or one bracket.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def json_depth(value: object) -> int:
    """The levels of arrays and objects in the decoded JSON ``value`` (walked without
    recursion; a scalar is 0)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def bracket_depth(payload: bytes) -> int:
    """The levels of arrays and objects of the JSON text ``payload``, from its brackets
    outside strings (for text too deep for the decoder)."""
    depth = deepest = 0
    for m in _TOKEN.finditer(payload):
        ch = m.group()
        if ch in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif ch in (b"]", b"}"):
            depth -= 1
    return deepest


def load_bounded(data: bytes, source: str, field: str, max_depth: int) -> Any:
    """The JSON value in ``data`` (read from ``source``); :class:`FormatError` naming
    ``field`` when it is not JSON, and ``"<field> (nesting depth)"`` with the bound
    when it nests more than ``max_depth`` levels of arrays and objects."""
    try:
        value = json.loads(data)
    except RecursionError:
        value, depth = None, bracket_depth(data)
    except ValueError as exc:
        raise FormatError(source, field, data[:40], "JSON", str(exc)) from None
    else:
        depth = json_depth(value)
    if depth > max_depth:
        raise FormatError(
            source,
            f"{field} (nesting depth)",
            depth,
            f"<= {max_depth} levels of arrays and objects",
        )
    return value
