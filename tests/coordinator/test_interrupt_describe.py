"""A run interrupted (Ctrl-C) while its source (local, at least
:data:`~ptestore.provenance.stamp.CONCURRENT_MIN`) is still being described in its own
thread stops that description at its next piece: the output's digest, which waits for
it, is told to stop first and the description cancelled before the digest is joined
(joined first, the interrupt waited for the whole source to be hashed). The description
is held until the interrupt is raised, so the order is the same on any machine."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from support.large import Inflate, inflated

import ptestore
from ptestore._background import Cancelled
from ptestore.coordinator import Event
from ptestore.provenance import stamp

CEILING = 120  # seconds: only for a hang


def test_an_interrupt_stops_the_source_description(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "big.pte"
    inflated(src, stamp.CONCURRENT_MIN // 3)  # four values: larger than CONCURRENT_MIN
    interrupted = threading.Event()
    ended: list[str] = []
    real = stamp.describe_source

    def held(loader: Any, **kwargs: Any) -> Any:
        assert interrupted.wait(CEILING)  # described only once the run was interrupted
        try:
            info = real(loader, **kwargs)
        except Cancelled:
            ended.append("cancelled")
            raise
        ended.append("described whole")
        return info

    monkeypatch.setattr(stamp, "describe_source", held)

    def tracer(event: Event) -> None:
        if event.kind == "write":
            interrupted.set()
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ptestore.specialize(
            src,
            tmp_path / "out.pte",
            backends=[Inflate("XnnpackBackend", stamp.CONCURRENT_MIN // 3 + 64)],
            event_tracer=tracer,
        )
    assert ended == ["cancelled"]
    assert not (tmp_path / "out.pte").exists()
