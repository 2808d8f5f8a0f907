"""Progress of a ``ptestore specialize`` run on stderr, from the run's events.

One bar per phase, all counting bytes in binary units: the counts are written by the
summary's own :func:`~ptestore.cli.options.human_bytes` (KiB, MiB, GiB), and tqdm's own
scaling, where it shows, uses ``unit_divisor=1024``:

- each backend: the delegate inputs handed to it and the keys and blobs it replaces, as
  they happen (the slow part for a real compiler);
- writing: the bytes of every output file;
- fetching (``ensure`` of a job index): one bar per file, with the bytes taken from
  local files (a base, a resumed download) instead of the store;
- publishing: a line when the last byte is written (an S3 completion can take seconds)
  and one per published file.

A URL is shown as :func:`~ptestore.storage.types.redacted_url` shows it (an event
carries it as given: a presigned URL's signature, a password); a fetched file is named
by its path's last part. Progress is shown only on a terminal, never with
``--no-progress``, ``--quiet`` or ``--json``, and never when ``TQDM_DISABLE`` is set to
anything but ``0``/``false``/empty. tqdm is imported only when a bar is drawn.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from .._text import printable
from ..storage.types import redacted_url
from .options import human_bytes

if TYPE_CHECKING:
    from ..coordinator import Event

__all__ = ["Progress", "progress_wanted"]


def progress_wanted(*, disabled: bool, stream: TextIO | None = None) -> bool:
    """Whether to draw progress: not ``disabled`` (a flag), ``TQDM_DISABLE`` unset or
    false, and ``stream`` (default stderr) a terminal."""
    if disabled:
        return False
    if os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false", "no"):
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """An ``event_tracer`` that draws bars on ``stream``; :meth:`close` when done."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self._bar: Any = None
        self._phase: str | None = None
        self._publishing = False
        self._done = 0
        self._label = ""
        self._desc = ""
        #: A fetch's bytes by origin (``store``, ``base``, ``part``): the local ones shown.
        self._from: dict[str, int] = {}

    def _open(self, phase: str, desc: str, total: int | None) -> Any:
        if self._phase != phase:
            self._close_bar()
            from tqdm import tqdm

            counts = "{desc} [{elapsed}]"
            bar = "{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]"
            self._bar = tqdm(
                total=total,
                desc=desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=self.stream,
                leave=True,
                dynamic_ncols=True,
                bar_format=counts if total is None else bar,
            )
            self._phase, self._done, self._label, self._desc = phase, 0, "", desc
            self._from = {}
        return self._bar

    def _advance(self, bar: Any, nbytes: int, refresh: bool = False) -> None:
        self._done += nbytes
        total = "" if bar.total is None else f"/{human_bytes(bar.total)}"
        label = f", {self._label}" if self._label else ""
        counts = f"{self._desc}: {human_bytes(self._done)}{total}{label}"
        bar.set_description_str(counts, refresh=refresh)
        bar.update(nbytes)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._phase = None, None

    def _say(self, text: str) -> None:
        self._close_bar()
        print(text, file=self.stream, flush=True)

    def __call__(self, event: Event) -> None:
        kind = event.kind
        # Backend ids, keys and method names are the file's: one printable line each.
        backend = printable(str(event.backend))
        if kind == "backend_start":
            self._open(f"backend:{event.backend}", f"backend {backend}", None)
        elif kind in ("input", "replacement"):
            bar = self._open(f"backend:{event.backend}", f"backend {backend}", None)
            what = "input" if kind == "input" else "replaced"
            label = event.key if event.key is not None else f"{event.method} blob"
            label = printable(label)
            self._label = f"{what} {label}"[:48]
            self._advance(bar, event.nbytes)
        elif kind == "backend_end":
            bar = self._open(f"backend:{event.backend}", f"backend {backend}", None)
            self._label = f"{event.status} in {event.seconds:.2f} s"
            self._advance(bar, 0, refresh=True)
            self._close_bar()
        elif kind == "write":
            bar = self._open("write", "writing", event.total)
            self._advance(bar, event.nbytes)
            if event.total and event.done >= event.total and not self._publishing:
                self._publishing = True
                self._say("publishing...")
        elif kind == "fetch":  # ensure of a job index: one bar per downloaded file
            # the file's name, not the request's query (a presigned URL's signature)
            name = printable(redacted_url(event.url or "").partition("?")[0].rsplit("/", 1)[-1])
            bar = self._open(f"fetch:{event.url}", f"fetching {name}", event.total or None)
            self._from[event.status or "store"] = (
                self._from.get(event.status or "store", 0) + event.nbytes
            )
            local = self._from.get("base", 0) + self._from.get("part", 0)
            self._label = f"{human_bytes(local)} local" if local else ""
            self._advance(bar, event.nbytes)
        elif kind == "publish":
            url = printable(redacted_url(event.url or ""))
            self._say(f"published {url} ({event.seconds:.2f} s)")

    def close(self) -> None:
        """Close the bar in progress, if any."""
        self._close_bar()
