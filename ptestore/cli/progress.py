"""Progress of a ``ptestore specialize`` run on stderr, from the run's events.

One bar per phase, all counting bytes in binary units (KiB, MiB, GiB: ``unit_scale``
with ``unit_divisor=1024``, as the summary's :func:`~ptestore.cli.options.human_bytes`):

- each backend: the delegate inputs handed to it and the keys and blobs it replaces, as
  they happen (the slow part for a real compiler);
- writing: the bytes of every output file;
- publishing: a line when the last byte is written (an S3 completion can take seconds)
  and one per published file.

Progress is shown only on a terminal, never with ``--no-progress``, ``--quiet`` or
``--json``, and never when ``TQDM_DISABLE`` is set to anything but ``0``/``false``/empty.
tqdm is imported only when a bar is drawn.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

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

    def _open(self, phase: str, desc: str, total: int | None) -> Any:
        if self._phase != phase:
            self._close_bar()
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=self.stream,
                leave=True,
                dynamic_ncols=True,
            )
            self._phase = phase
        return self._bar

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._phase = None, None

    def _say(self, text: str) -> None:
        self._close_bar()
        print(text, file=self.stream, flush=True)

    def __call__(self, event: Event) -> None:
        kind = event.kind
        if kind == "backend_start":
            self._open(f"backend:{event.backend}", f"backend {event.backend}", None)
        elif kind in ("input", "replacement"):
            bar = self._open(f"backend:{event.backend}", f"backend {event.backend}", None)
            what = "in" if kind == "input" else "out"
            label = event.key if event.key is not None else f"{event.method} blob"
            bar.set_postfix_str(f"{what}: {label}"[:48], refresh=False)
            bar.update(event.nbytes)
        elif kind == "backend_end":
            bar = self._open(f"backend:{event.backend}", f"backend {event.backend}", None)
            bar.set_postfix_str(f"{event.status} in {event.seconds:.2f} s", refresh=True)
            self._close_bar()
        elif kind == "write":
            bar = self._open("write", "writing", event.total)
            bar.update(event.nbytes)
            if event.total and event.done >= event.total and not self._publishing:
                self._publishing = True
                self._say("publishing...")
        elif kind == "publish":
            self._say(f"published {event.url} ({event.seconds:.2f} s)")

    def close(self) -> None:
        """Close the bar in progress, if any."""
        self._close_bar()
