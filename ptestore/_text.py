"""How strings and values from a file appear in messages and reports.

A hostile file's fields are data, never layout: :func:`shown` cuts a value to about
80 characters (a 1 MB field makes a one-line error message, not a 1 MB one), and
:func:`printable` escapes the control characters of a key or name a text report prints
(a newline cannot forge a report line, an escape sequence cannot drive the terminal), and
:func:`clipped` cuts one to :data:`REPORT_CHARS` first (a 1 MB record field printed whole
made a 1 MB report line);
:func:`for_terminal` does the same for a whole message, its own line breaks kept;
:func:`one_line` makes a message one line of bounded length, for the CLI's error line and
the names a log record embeds (a line break in a URL from an index cannot start a
forged line, a 3 MB URL makes a line of a few hundred characters), and
:func:`names_cut` shows the names a message embeds as they are (an index's URLs) as a
report prints them, before the message leaves the library.
:func:`head_bytes` cuts a file name to a number of bytes, at a character.
"""

from __future__ import annotations

__all__ = [
    "LINE_CHARS",
    "REPORT_CHARS",
    "SHOWN_CHARS",
    "clipped",
    "for_terminal",
    "head_bytes",
    "names_cut",
    "one_line",
    "printable",
    "shown",
]

#: How many characters of a value a message shows (:func:`shown`).
SHOWN_CHARS = 80
#: How many characters of a string from a file a text report prints (:func:`clipped`).
REPORT_CHARS = 300
#: The longest run without a space :func:`one_line` leaves whole: a local path (Linux's
#: PATH_MAX, so the file name at its end is never cut off), a URL; the names an index
#: gives are cut to :data:`REPORT_CHARS` where they are embedded (:func:`names_cut`).
_RUN_CHARS = 4096
#: The longest line :func:`one_line` makes (the CLI's error line): room for two whole
#: paths (``SRC -> DST``) and their words.
LINE_CHARS = 3 * _RUN_CHARS


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


def one_line(message: str) -> str:
    """``message`` as one line of a terminal, the CLI's error line and what a log record
    embeds (its string and exception arguments): each run of characters without a
    space longer than :data:`_RUN_CHARS` (longer than any local path: a value from a
    file) cut by :func:`clipped`, every character that is
    not printable escaped as ``repr`` writes it (a line break too: ``\\n``; backslashes
    kept, as :func:`for_terminal` keeps them), and the whole cut to :data:`LINE_CHARS`.
    A URL from an index holding a line break cannot make a second, forged line; one of
    3 MB makes a bounded line (and a few hundred characters where the message embeds
    it through :func:`names_cut`). ``--json`` keeps the message
    whole."""
    if len(message) > _RUN_CHARS:
        message = " ".join(_run_cut(w) for w in message.split(" "))
    if not message.isprintable():
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    return clipped(message, LINE_CHARS)


def _run_cut(run: str) -> str:
    """A run of :func:`one_line` cut by :func:`clipped` when it is longer than
    :data:`_RUN_CHARS`, the punctuation that ends it (``name:``) kept."""
    if len(run) <= _RUN_CHARS:
        return run
    if run[-1] in ":;,)":
        return clipped(run[:-1], _RUN_CHARS) + run[-1]
    return clipped(run, _RUN_CHARS)


def names_cut(message: str, names: list[str]) -> str:
    """``message`` with each of ``names`` it embeds as it is (strings from a file: the
    URLs an index names) shown as a text report prints it, when it is longer than
    :data:`REPORT_CHARS` or holds a character that is not printable:
    ``printable(clipped(name))``; ``message`` itself when none is."""
    for name in names:
        if name and (len(name) > REPORT_CHARS or not name.isprintable()) and name in message:
            message = message.replace(name, printable(clipped(name)))
    return message


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
