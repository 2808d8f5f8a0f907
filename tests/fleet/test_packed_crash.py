"""A packed-weight delivery killed (SIGKILL) at every observed point resumes without
trusting unverified bytes, and never leaves a file ``find_cache`` would hand out that is
not the index's (the fetch crash tests of ``test_fetch_crash.py`` for ``fetch
--xnnpack-cache``).

The device holds version 1 and its packed-weight file; the child (a fresh interpreter,
``stepper.run_spawned``) fetches version 2 with ``xnnpack_cache=True`` and reports each
point (a chunk put in place, the verified count written, the pair published, the packed
file installed), waiting for the parent's go-ahead. It is killed at each point of the
packed file's delivery; garbage is written past the verified chunks of what it left,
and the fetch runs again: it resumes at exactly the verified chunks and installs the
index's file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support.delta import PHONE, packed_job, packed_run
from writers.stepper import run_spawned

import ptestore
from ptestore.fleet.index import load_index
from ptestore.provenance.chunks import CHUNK_SIZE
from ptestore.testing.runtime import runtime_unavailable

pytestmark = [
    pytest.mark.interop,
    pytest.mark.slow,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

TESTS = str(Path(__file__).parents[1])

CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from writers.stepper import probe_from_env
import ptestore
from ptestore.fleet import chunked, fetch as fetch_module
from ptestore.xnnpack import adopt

probe = probe_from_env()
real_add, real_save = chunked.Sink.add, chunked._save
real_rename, real_publish = fetch_module.rename, adopt.publish_file

def add(self, origin, nbytes):
    real_add(self, origin, nbytes)
    probe.point(f"{'packed' if '.xnnpack-' in self.url else 'pair'}:{origin}:{self.done}")

def save(meta_path, state, verified):
    real_save(meta_path, state, verified)
    probe.point(f"{'packed' if 'xnnpack-download' in meta_path else 'pair'}:saved:{verified}")

def rename(src, dst, **kwargs):
    real_rename(src, dst, **kwargs)
    probe.point("pair:published")

def publish_file(*args, **kwargs):
    made = real_publish(*args, **kwargs)
    probe.point("packed:installed")
    return made

chunked.Sink.add, chunked._save = add, save
fetch_module.rename, adopt.publish_file = rename, publish_file
args = json.loads(sys.argv[1])
ptestore.fetch(args["index"], args["dest"], model="m", device="phone", base=args["dest"],
               chunk_size=args["chunk_size"], xnnpack_cache=True)
"""


def _child(index: str, dest: Path, kill_at: int | None) -> Any:
    args = {"index": index, "dest": str(dest), "chunk_size": CHUNK_SIZE}
    argv = [sys.executable, "-c", CHILD, json.dumps(args), TESTS]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    return run_spawned(argv, kill_at=kill_at, env=env)


def test_a_packed_delivery_killed_anywhere_resumes_at_its_verified_chunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(Path(TESTS).parent / "scripts"))
    try:
        from make_xnnpack_models import export_linear_stack
    finally:
        sys.path.remove(str(Path(TESTS).parent / "scripts"))
    (model,) = export_linear_stack(tmp_path / "lin.pte", layers=4, dim=1024)
    out = str(tmp_path / "out")
    index = packed_run(packed_job(tmp_path, model, out, "1"), capsys)
    template = tmp_path / "template" / "m.pte"
    old = ptestore.fetch(index, template, model="m", device=PHONE, xnnpack_cache=True).xnnpack
    assert old is not None
    index = packed_run(packed_job(tmp_path, model, out, "2.5"), capsys)
    (entry,) = load_index(index)["entries"]
    field = entry["xnnpack"]
    want = Path(field["url"]).read_bytes()

    shutil.copytree(template.parent, tmp_path / "calibration")
    calibration = _child(index, tmp_path / "calibration" / "m.pte", None)
    assert calibration.status == 0, calibration.stderr
    events: list[str] = calibration.events
    first = events.index("pair:published") + 1
    packed = events[first:]
    # the last chunk (the index: the layout) from the store, the chunks the earlier file
    # holds (their count made durable), the changed ones from the store, every count
    # made durable, then the file installed
    kinds = [e.split(":")[1] for e in packed]
    assert packed[0] == "packed:saved:0" and packed[-1] == "packed:installed", packed
    assert kinds.count("base") >= 2 and kinds.count("store") >= 2, packed  # 10 points here

    for k in range(first, len(events)):
        event = events[k]
        d = tmp_path / f"kill{k}"
        shutil.copytree(template.parent, d)
        dest = d / "m.pte"
        outcome = _child(index, dest, k)
        assert outcome.status == -signal.SIGKILL, (event, outcome.stderr)
        parts = list(d.glob("xnnpack-download-*.part"))
        # (killed once the file was installed: its .part renamed, a count left behind)
        verified = json.loads(Path(f"{parts[0]}.json").read_text())["verified"] if parts else 0
        if event == "packed:installed":
            assert not parts and list(d.glob(f"{Path(field['url']).name.split('.', 1)[1]}"))
        for part in parts:
            with open(part, "r+b") as f:  # what a torn write could leave past them
                f.seek(verified * CHUNK_SIZE)
                f.write(os.urandom(1000))
        moved: dict[str, int] = {}

        def count(e: Any, moved: dict[str, int] = moved) -> None:
            if ".xnnpack-" in e.url:
                moved[e.origin] = moved.get(e.origin, 0) + e.nbytes

        got = ptestore.fetch(
            index, dest, model="m", device=PHONE, base=dest, xnnpack_cache=True, events=count
        ).xnnpack
        assert got is not None and got["sha256"] == field["sha256"], event
        assert Path(got["path"]).read_bytes() == want, event
        assert moved.get("part", 0) == min(verified * CHUNK_SIZE, len(want)), event
        assert sum(moved.values()) == len(want), event
        assert not list(d.glob("xnnpack-download-*")), event
