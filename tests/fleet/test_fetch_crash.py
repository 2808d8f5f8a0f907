"""A fetch killed (SIGKILL) at observed points resumes without trusting unverified bytes
(issue 28 part 1, crash tests of the chunk records).

The child is a fresh interpreter (``stepper.run_spawned``) whose fetch reports each
point that matters (a chunk put in place, from the store, a base or the ``.part``; the
verified count written to ``DEST.part.json``; a file published) and waits for the
parent's go-ahead, so the kill lands exactly there. A calibration run records the
sequence; then the fetch is killed at each point, garbage is written past the verified
chunks of the ``.part`` it left (a torn write would leave some), and the fetch is run
again: it resumes at exactly the verified chunks, and the published file is the
artifact's. A byte flipped inside the verified chunks is caught and named on resume."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support.delta import flip, trailer_size, two_versions
from writers.stepper import run_spawned

import ptestore
from ptestore.provenance.chunks import CHUNK_SIZE

TESTS = str(Path(__file__).parents[1])

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from writers.stepper import probe_from_env
import ptestore
from ptestore.fleet import chunked, fetch as fetch_module

probe = probe_from_env()
real_add, real_save, real_rename = chunked.Sink.add, chunked._save, fetch_module.rename

def add(self, origin, nbytes):
    real_add(self, origin, nbytes)
    probe.point(f"{origin}:{self.done}")

def save(meta_path, state, verified):
    real_save(meta_path, state, verified)
    probe.point(f"saved:{verified}")

def rename(src, dst, **kwargs):
    real_rename(src, dst, **kwargs)
    probe.point("published")

chunked.Sink.add, chunked._save, fetch_module.rename = add, save, rename
args = json.loads(sys.argv[1])
ptestore.fetch(args["src"], args["dest"], base=args["base"], chunk_size=args["chunk_size"])
"""


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return two_versions(tmp_path_factory.mktemp("versions"))


def _child(src: Path, dest: Path, base: Path | None, kill_at: int | None) -> Any:
    args = {"src": str(src), "dest": str(dest), "base": None if base is None else str(base)}
    args["chunk_size"] = CHUNK_SIZE  # one request per chunk: a kill point between each
    argv = [sys.executable, "-c", CHILD, json.dumps(args), TESTS]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    return run_spawned(argv, kill_at=kill_at, env=env)


def _killed_everywhere(tmp_path: Path, src: Path, base: Path | None) -> list[str]:
    calibration = _child(src, tmp_path / "calibration" / "m.pte", base, None)
    assert calibration.status == 0, calibration.stderr
    events = calibration.events
    assert events[-1] == "published" and events[0] == "saved:0"
    for k, event in enumerate(events):
        dest = tmp_path / f"kill{k}" / "m.pte"
        outcome = _child(src, dest, base, k)
        assert outcome.status == -signal.SIGKILL, (event, outcome.stderr)
        if event == "published":
            assert dest.read_bytes() == src.read_bytes()
            continue
        assert not dest.exists(), event
        state = json.loads(Path(str(dest) + ".part.json").read_text())
        verified = state["verified"]
        part = Path(str(dest) + ".part")
        with open(part, "r+b") as f:  # what a torn write could leave past them
            f.seek(verified * CHUNK_SIZE)
            f.write(os.urandom(1000))
        result = ptestore.fetch(src, dest, base=base, chunk_size=CHUNK_SIZE)
        (got,) = result.files
        content = got["size"] - trailer_size(src)
        assert got["resumed_from"] == min(verified * CHUNK_SIZE, content), event
        assert got["part_damaged"] == [], event
        assert dest.read_bytes() == src.read_bytes(), event
        assert not part.exists() and not Path(str(dest) + ".part.json").exists()
    return events


@pytest.mark.slow  # 14 fresh interpreters
def test_killed_at_every_point_of_a_download(tmp_path: Path, versions: tuple[Path, Path]) -> None:
    _, b = versions
    events = _killed_everywhere(tmp_path, b, None)
    # the short last chunk from the tail read, then each whole chunk from the store and
    # its count made durable (the last one's with the tail's), the trailer, the rename
    kinds = [e.split(":")[0] for e in events]
    assert kinds == ["saved", "store", *["store", "saved"] * 5, "store", "published"]
    saved = [e for e in events if e.startswith("saved")]
    assert saved == ["saved:0", "saved:1", "saved:2", "saved:3", "saved:4", "saved:6"]


@pytest.mark.slow  # 11 fresh interpreters
def test_killed_at_every_point_of_a_delta_download(
    tmp_path: Path, versions: tuple[Path, Path]
) -> None:
    a, b = versions
    events = _killed_everywhere(tmp_path, b, a)
    # chunks 0, 2-5 from the base, chunk 0's count made durable, chunk 1 from the store,
    # then all six counted at once, the trailer, the rename
    kinds = [e.split(":")[0] for e in events]
    assert kinds == ["saved", *["base"] * 5, "saved", "store", "saved", "store", "published"]
    assert events[6] == "saved:1" and events[8] == "saved:6"


@pytest.mark.slow  # 11 fresh interpreters
def test_killed_at_every_point_of_a_delta_download_of_a_moved_layout(
    tmp_path: Path, versions: tuple[Path, Path]
) -> None:
    """The portable source as base of an artifact whose first value grew (every later
    segment moved): the first chunk (the layout) comes from the store before any chunk
    from the base; killed anywhere, the next run resumes at the verified chunks."""
    from support.delta import grown

    a, _ = versions
    src = a.parent.parent / "big.pte"
    moved = grown(src, tmp_path / "moved" / "m.pte")
    events = _killed_everywhere(tmp_path, moved, src)
    kinds = [e.split(":")[0] for e in events]
    # chunk 0 (after the base's bytes there failed the check), then chunk 1 at its own
    # offsets and chunks 3-5 moved, from the base; all but chunk 2 counted; chunk 2 from
    # the store; all six counted, the trailer, the rename
    assert kinds == [
        "saved",
        "store",
        *["base"] * 4,
        "saved",
        "store",
        "saved",
        "store",
        "published",
    ]
    assert events[6] == "saved:2" and events[8] == "saved:6"


def test_a_flipped_byte_in_the_verified_chunks_of_a_part_is_caught_and_named(
    tmp_path: Path, versions: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _, b = versions
    dest = tmp_path / "dev" / "m.pte"
    calibration = _child(b, tmp_path / "calibration" / "m.pte", None, None)
    outcome = _child(b, dest, None, calibration.events.index("saved:4"))
    assert outcome.status == -signal.SIGKILL
    part = Path(str(dest) + ".part")
    flip(part, 2 * CHUNK_SIZE + 777)  # in chunk 2, verified before the kill
    with caplog.at_level(logging.WARNING, "ptestore.fleet.chunked"):
        result = ptestore.fetch(b, dest, chunk_size=CHUNK_SIZE)
    (got,) = result.files
    assert got["resumed_from"] == 2 * CHUNK_SIZE  # chunks 0 and 1 still check
    lo, hi = 2 * CHUNK_SIZE, 3 * CHUNK_SIZE
    assert [(d["chunk"], d["start"], d["end"]) for d in got["part_damaged"]] == [(2, lo, hi)]
    assert any(
        m.startswith(f"{part}: chunk 2 (bytes {lo}:{hi}) verified before no longer has its digest")
        for m in caplog.messages
    )
    assert dest.read_bytes() == b.read_bytes()


def test_a_count_without_its_part_starts_again(tmp_path: Path, versions: tuple[Path, Path]) -> None:
    _, b = versions
    dest = tmp_path / "dev" / "m.pte"
    calibration = _child(b, tmp_path / "calibration" / "m.pte", None, None)
    outcome = _child(b, dest, None, calibration.events.index("saved:3"))
    assert outcome.status == -signal.SIGKILL
    Path(str(dest) + ".part").unlink()  # the count stays, its file is gone
    (got,) = ptestore.fetch(b, dest, chunk_size=CHUNK_SIZE).files
    assert got["resumed_from"] == 0 and dest.read_bytes() == b.read_bytes()
