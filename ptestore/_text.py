"""How strings and values from a file appear in messages and reports.

A hostile file's fields are data, never layout: :func:`shown` cuts a value to about
80 characters (a 1 MB field makes a one-line error message, not a 1 MB one), and
:func:`printable` escapes the control characters of a key or name a text report prints
(a newline cannot forge a report line, an escape sequence cannot drive the terminal), and
:func:`clipped` cuts one to :data:`REPORT_CHARS` first (a 1 MB record field printed whole
made a 1 MB report line);
:func:`for_terminal` does the same for a whole message, its own line breaks kept.
:func:`head_bytes` cuts a file name to a number of bytes, at a character.
"""

from __future__ import annotations

__all__ = [
    "REPORT_CHARS",
    "SHOWN_CHARS",
    "clipped",
    "for_terminal",
    "head_bytes",
    "printable",
    "shown",
]

#: How many characters of a value a message shows (:func:`shown`).
SHOWN_CHARS = 80
#: How many characters of a string from a file a text report prints (:func:`clipped`).
REPORT_CHARS = 300


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, at most about ``limit`` characters: a string or
    bytes value longer than ``limit`` shows the repr of its first ``limit`` and ``... (N
    characters)`` (``bytes`` for bytes), anything else its repr cut at ``limit`` followed
    by the repr's length. A hostile file's 1 MB field then makes a one-line message, not
    a 1 MB one."""
    if isinstance(value, (str, bytes, bytearray)):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    try:
        text = repr(value)
    except ValueError:  # an int past the digits Python converts (4300), or one inside
        return f"<{type(value).__name__} too large to show>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def printable(text: str) -> str:
    """``text`` as a text report prints a string from a file: unchanged when every
    character is printable (``str.isprintable``: ordinary keys, names with spaces),
    else with each non-printable character (a newline, an escape, a tab, U+2028, ...)
    and each backslash written as ``repr`` writes it (``\\n``, ``\\x1b``,
    ``\\\\``), so the result is one line of printable characters."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() and c != "\\" else repr(c)[1:-1] for c in text)


def clipped(text: str, limit: int = REPORT_CHARS) -> str:
    """``text``, a string from a file (a record's device name, URL, spec, compatibility
    string), as a text report prints it, before :func:`printable` escapes its line: when
    it is longer than ``limit`` characters, its first ``limit`` followed by ``... (N
    characters)``; a 1 MB field makes a readable line, not a 1 MB one (``--json`` keeps
    it whole). Quoted, as ``repr`` writes it, the same string is :func:`shown` with
    this ``limit``."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def for_terminal(message: str) -> str:
    """``message`` as the CLI prints it on a terminal: each non-printable character but
    a line break (an escape, a carriage return, a backspace, U+2028, ...) written as
    ``repr`` writes it (``\\x1b``, ``\\r``), so a name from a file that a message
    embeds as it is cannot drive the terminal or overwrite the line. Backslashes are
    kept (a message's ``repr`` of a value has escaped its own already)."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() or c == "\n" else repr(c)[1:-1] for c in message)


def head_bytes(name: str, limit: int) -> str:
    """The longest head of the file name ``name`` that takes at most ``limit`` bytes as
    the OS is given it (UTF-8, undecodable bytes as ``os.fsencode`` gives them back),
    cut at a character, never inside one: what a name built from another is cut to,
    so that it stays under NAME_MAX whatever the characters (a name's length in
    characters says nothing of its bytes: ``é`` takes two)."""
    data = name.encode("utf-8", "surrogateescape")
    if len(data) <= limit:
        return name
    head = data[:limit].decode("utf-8", "surrogateescape")
    while not name.startswith(head):  # the bytes of a character cut in two: dropped
        head = head[:-1]
    return head
