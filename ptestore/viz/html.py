"""Shared pieces of the self-contained HTML pages: escaping, embedded JSON, the page frame.

Every page is one file: inline CSS, inline SVG, a little inline JavaScript and its data
as embedded JSON. Nothing is fetched (no fonts, images, scripts or styles from anywhere).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import stat
from typing import Any

__all__ = [
    "BASE_CSS",
    "check_output_path",
    "embed_json",
    "esc",
    "human",
    "is_stdout",
    "page",
    "write_text",
]

#: The style every page shares (system fonts only: nothing is loaded).
BASE_CSS = """
:root { --fg:#1d232a; --muted:#5b6670; --line:#d7dde3; --bg:#ffffff; --panel:#f5f7f9;
  --sel:#ff8c00; }
* { box-sizing: border-box; }
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); margin: 16px 20px; }
h1 { font-size: 17px; margin: 0 0 4px; }
h2 { font-size: 14px; margin: 18px 0 6px; }
.muted { color: var(--muted); }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12px; }
table { border-collapse: collapse; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left;
  vertical-align: top; }
th { background: var(--panel); position: sticky; top: 0; z-index: 1; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.panel { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
  padding: 8px 12px; }
.controls { margin: 8px 0; display: flex; gap: 14px; align-items: center; flex-wrap: wrap; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  vertical-align: -2px; margin-right: 4px; border: 1px solid rgba(0,0,0,.25); }
.legend span.item { margin-right: 14px; white-space: nowrap; }
tr.selected td { background: #fff1dd; }
"""


def esc(value: object) -> str:
    """``value`` as HTML text (attributes included)."""
    return html.escape(str(value), quote=True)


def embed_json(value: Any) -> str:
    """``value`` as JSON safe inside ``<script type="application/json">``."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def human(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB``, ``4.0 GiB``."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


def page(title: str, body: str, *, css: str = "", script: str = "", data: Any = None) -> str:
    """A complete HTML document: ``body`` (already HTML), its CSS and script inline, and
    ``data`` (if any) as ``<script type="application/json" id="ptestore-data">``."""
    # No network: forbid every fetch a page could make, even by mistake. The one script
    # runs by its SHA-256 (no other inline script could, were one ever let into the body);
    # styles stay inline (the bars' colours and offsets are style attributes), which a
    # page that cannot fetch anything cannot turn into a request.
    scripts = "'none'"
    if script:
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        scripts = f"'sha256-{digest}'"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        f"style-src 'unsafe-inline'; script-src {scripts}; img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{BASE_CSS}{css}</style>",
        "</head><body>",
        body,
    ]
    if data is not None:
        parts.append(
            f'<script type="application/json" id="ptestore-data">{embed_json(data)}</script>'
        )
    if script:
        parts.append(f"<script>{script}</script>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to the local file ``path`` (a report: no atomic publish needed,
    but never a half-written page left under the final name).

    A ``path`` that is a regular file, or no file yet, is replaced atomically (a
    temporary file beside it, renamed); one that is, or links to, a character device
    (``/dev/null``, a terminal) or a FIFO (``/proc/self/fd/N`` of a pipe) is written
    through, opened for writing as a shell's ``>`` opens it (a FIFO waits for its
    reader), and stays what it was: never replaced by a regular file. Anything else (a
    directory, a socket, a block device) is refused.

    Raises :class:`~ptestore.errors.StorageError` (``PermissionDenied`` when refused,
    ``ConfigurationError`` for a kind of file a page cannot be written to) naming
    ``path`` when it cannot be written."""
    from ..errors import PermissionDenied, StorageError
    from ..storage.atomic import put_bytes
    from ..storage.types import file_path

    path = os.fspath(path)
    data = text.encode("utf-8")
    local = file_path(path) or path
    if _written_through(local, path) and _write_through(local, path, data):
        return
    try:
        put_bytes(path, data, durable=False)  # a report: no fsync
    except StorageError as exc:
        cause = exc.__cause__
        why = (cause.strerror or str(cause)) if isinstance(cause, OSError) else str(exc)
        kind = PermissionDenied if isinstance(exc, PermissionError) else StorageError
        raise kind(f"{path}: cannot write the page: {why}") from exc


def _written_through(local: str, shown: str) -> bool:
    """Whether the page goes through ``local`` (what it is, links followed, is a
    character device or a FIFO) rather than replacing it; raises ``ConfigurationError``
    for a kind of file a page cannot be written to (``shown``: the name given)."""
    try:
        mode = os.stat(local).st_mode
    except OSError:  # no file yet (or not one to look at): the atomic replace says why
        return False
    if stat.S_ISREG(mode):
        return False
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return True
    from ..errors import ConfigurationError
    from ..storage.regular import file_kind

    raise ConfigurationError(f"{shown}: is {file_kind(mode)}: {_WRITABLE}")


#: What a page may be written to, for the refusals.
_WRITABLE = (
    "a page is written to a regular file (replaced atomically), a character device or a "
    "FIFO (written through), or - for stdout"
)


def _write_through(local: str, shown: str, data: bytes) -> bool:
    """``data`` written through the character device or FIFO at ``local``; False
    (nothing written) when what was opened is a regular file after all (replaced since
    it was looked at: the atomic replace then)."""
    from ..errors import PermissionDenied, StorageError

    try:
        fd = os.open(local, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        kind = PermissionDenied if isinstance(exc, PermissionError) else StorageError
        raise kind(f"{shown}: cannot write the page: {exc.strerror or exc}") from exc
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise StorageError(f"{shown}: cannot write the page: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return True


def is_stdout(path: str | os.PathLike[str]) -> bool:
    """Whether a page's ``path`` is stdout: ``-``, or the file stdout is (``/dev/stdout``,
    ``/proc/self/fd/1``, a link to either, or the file or pipe stdout was sent to). The
    CLI writes such a page through its own stdout, after anything written there."""
    path = os.fspath(path)
    if path == "-":
        return True
    from ..storage.types import file_path

    try:
        given, ours = os.stat(file_path(path) or path), os.fstat(1)
    except OSError:
        return False
    return (given.st_dev, given.st_ino) == (ours.st_dev, ours.st_ino)


def check_output_path(path: str | os.PathLike[str], flag: str) -> None:
    """Refuse, before any work, a page path that cannot be written: a directory, a file
    in a directory that does not exist, or a kind of file a page cannot be written to (a
    socket, a block device: :func:`write_text`). ``-`` is stdout. Raises
    :class:`~ptestore.errors.ConfigurationError` naming ``flag`` and ``path``."""
    from ..errors import ConfigurationError
    from ..storage.types import absolute_path, file_path

    path = os.fspath(path)
    if path == "-":
        return
    local = file_path(path) or path  # file:///x/page.html is /x/page.html
    if os.path.isdir(local):
        raise ConfigurationError(f"{flag} {path}: is a directory (give a file name)")
    try:
        _written_through(local, path)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{flag} {exc}") from None
    parent = os.path.dirname(absolute_path(local))
    if not os.path.isdir(parent):
        raise ConfigurationError(f"{flag} {path}: the directory {parent} does not exist")
