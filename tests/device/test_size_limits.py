"""Limits met before the first byte, never part-way: a file-size limit (``RLIMIT_FSIZE``,
``ulimit -f``, which the in-place reservation's ``fallocate`` does not meet) refuses an
in-place run before its journal is committed (the file unchanged, never left marked
``PTJ~``) and a new file's staged copy before its first byte; the free-space check of a
staged copy counts the provenance trailer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.fixtures import copy_pte, get_fixture
from support.smallfs import tmpfs

import ptestore
from ptestore.errors import StorageError
from ptestore.journal import journal_path
from ptestore.provenance import ProvenanceRequest

ROOT = Path(__file__).resolve().parents[2]
# No bytecode written under the limit (a .pyc cut short there would break later imports).
_ENV = {
    "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}",
    "PATH": "/usr/bin:/bin",
    "PYTHONDONTWRITEBYTECODE": "1",
}
SAME = ProvenanceRequest(created="2026-01-02T03:04:05Z")  # the same record each run
FX = get_fixture("mlp_xnnpack")
assert FX.doubled is not None and FX.doubled.key is not None
KEY = FX.doubled.key

# A child under a file-size limit of the model's size plus argv[3] bytes runs the model
# with its key grown by 4 KiB (ReplaceKey), in place or to another file.
_CHILD = r"""
import os, resource, sys
from support.large import ReplaceKey
import ptestore
src, dst, extra = sys.argv[1], sys.argv[2], int(sys.argv[3])
limit = os.path.getsize(src) + extra
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
grow = ReplaceKey("XnnpackBackend", sys.argv[4], extra=4096)
try:
    ptestore.specialize(src, dst, backends=[grow], in_place=src == dst)
except ptestore.StorageError as exc:
    print(exc)
else:
    print("ok")
"""


def _child(src: Path, dst: Path, extra: int) -> str:
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(src), str(dst), str(extra), KEY],
        capture_output=True,
        text=True,
        env=_ENV,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _grown_size(tmp_path: Path) -> int:
    """The size the grown run gives the model (with its trailer), without a limit."""
    src = copy_pte(tmp_path / "probe.pte")
    assert _child(src, src, 1 << 30) == "ok"
    return src.stat().st_size


def test_in_place_past_the_file_size_limit_is_refused_before_the_commit(tmp_path: Path) -> None:
    grown = _grown_size(tmp_path)
    src = copy_pte(tmp_path / "model.pte")
    before = src.read_bytes()
    limit = grown - 1
    msg = _child(src, src, limit - len(before))
    assert msg == (
        f"{src}: in place, {src} would reach {grown} bytes, past this process's file-size "
        f"limit of {limit} bytes (RLIMIT_FSIZE, ulimit -f); the file is unchanged: raise the "
        "limit and run again"
    )
    assert src.read_bytes() == before  # not marked PTJ~, nothing written
    assert not Path(journal_path(str(src))).exists()
    assert _child(src, src, grown - len(before)) == "ok"  # at the limit: done
    assert src.stat().st_size == grown


def test_a_journal_past_the_file_size_limit_is_refused_before_the_commit() -> None:
    """The journal is a file too: its planned size (the bytes moved, the plan) checked
    against the limit as the file's is (a child: the limit is the process's)."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from ptestore.coordinator.inplace_commit import check_size_limit\n"
        "check_size_limit('m.pte', '.m.pte.ptestore-jrnl2', 4096, 4096)\n"
        "try:\n"
        "    check_size_limit('m.pte', '.m.pte.ptestore-jrnl2', 4096, 4097)\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_ENV, check=False
    )
    assert r.stdout.strip() == (
        "m.pte: in place, its journal .m.pte.ptestore-jrnl2 would reach 4097 bytes, past "
        "this process's file-size limit of 4096 bytes (RLIMIT_FSIZE, ulimit -f); the file "
        "is unchanged: raise the limit and run again"
    ), r.stderr


def test_a_new_file_past_the_file_size_limit_is_refused_before_its_first_byte(
    tmp_path: Path,
) -> None:
    src = copy_pte(tmp_path / "model.pte")
    dst = tmp_path / "out.pte"
    msg = _child(src, dst, 4096)  # the spool fits, the grown output does not
    assert msg.startswith(f"{dst}: an output of up to ")
    assert msg.endswith(
        f"bytes is past this process's file-size limit of {src.stat().st_size + 4096} bytes "
        "(RLIMIT_FSIZE, ulimit -f); nothing was written: raise the limit and run again"
    )
    assert sorted(os.listdir(tmp_path)) == ["model.pte"]  # no staging file left


def _grown(src: Path, dst: Path, extra: int) -> tuple[int, int]:
    """``src`` with its key grown by ``extra`` bytes to ``dst``: (content, trailer) sizes."""
    from support.large import ReplaceKey

    from ptestore.provenance.trailer import read_trailer
    from ptestore.storage.loaders import open_loader

    grow = ReplaceKey("XnnpackBackend", KEY, extra=extra)
    ptestore.specialize(src, dst, backends=[grow], provenance=SAME)
    with open_loader(str(dst)) as loader:
        found = read_trailer(loader)
    assert found is not None
    return found.content_size, dst.stat().st_size - found.content_size


def test_a_staged_copy_s_room_counts_its_provenance_trailer(tmp_path: Path) -> None:
    """Room for the content and less than its trailer after it (the content 512 bytes
    short of a whole page, the trailer over 1 KB): refused before the first byte, with
    the trailer counted (it was written whole, then failed on the trailer)."""
    src = copy_pte(tmp_path / "model.pte")
    probe = tmp_path / "probe.pte"
    extra, (content, trailer) = 0, _grown(src, probe, 0)
    for _ in range(4):  # the output's content less than its trailer short of a page
        if 0 < -content % 4096 < trailer - 128:
            break
        extra += (4096 - trailer // 2 - content) % 4096  # segment alignment: again
        content, trailer = _grown(src, probe, extra)
    pages = -(-content // 4096) * 4096
    assert 0 < pages - content < trailer - 128, (content, trailer)
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        st = os.statvfs(mnt)
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # leaves the content's pages
            os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - pages)
        free = os.statvfs(mnt).f_bavail * st.f_frsize
        assert content < free == pages < content + trailer
        dst = mnt / "out.pte"
        with pytest.raises(StorageError) as err:
            _grown(src, dst, extra)
        msg = str(err.value)
        assert msg.startswith(f"{dst}: not enough free space for an output of "), msg
        asked = int(msg.split("an output of ")[1].split(" ")[0])
        assert content + trailer <= asked < content + 4 * trailer  # a bound, and close
        assert sorted(os.listdir(mnt)) == ["filler"]
        filler.unlink()
        _grown(src, dst, extra)
        assert dst.read_bytes() == probe.read_bytes()


# A child whose source is described in a thread of its own (as a local source of 32 MiB
# or more is), the backend going on once that description has ended.
_DESCRIBED_CHILD = r"""
import resource, sys, threading, time
from support.large import ReplaceKey
import ptestore
from ptestore.provenance import ProvenanceRequest, stamp
stamp.CONCURRENT_MIN = 0
src, dst, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])

class AfterDescribed(ReplaceKey):
    def initialize_backend_data(self, context, output):
        ceiling = time.monotonic() + 120  # (only a failure waits for it)
        while any(t.name == "ptestore-describe-source" for t in threading.enumerate()):
            assert time.monotonic() < ceiling
            time.sleep(0.01)
        super().initialize_backend_data(context, output)

if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
grow = AfterDescribed("XnnpackBackend", sys.argv[4], extra=4096)
same = ProvenanceRequest(created="2026-01-02T03:04:05Z")
try:
    ptestore.specialize(src, dst, backends=[grow], provenance=same)
except ptestore.StorageError as exc:
    print(exc)
else:
    print("ok")
"""


def test_a_source_described_in_the_background_counts_once_its_description_ended(
    tmp_path: Path,
) -> None:
    """The trailer's bound of a run whose source was described in a thread of its own
    is the record's once that description ended (it stayed the 1 MiB payload limit for
    the whole run: an output that fits under a file-size limit, 4 KiB to spare, was
    refused)."""
    src = copy_pte(tmp_path / "model.pte")

    def run(dst: Path, limit: int) -> str:
        argv = [sys.executable, "-c", _DESCRIBED_CHILD, str(src), str(dst), str(limit), KEY]
        r = subprocess.run(argv, capture_output=True, text=True, env=_ENV, check=False)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert run(tmp_path / "probe.pte", 0) == "ok"
    size = (tmp_path / "probe.pte").stat().st_size
    assert run(tmp_path / "out.pte", size + 4096) == "ok"
    assert (tmp_path / "out.pte").read_bytes() == (tmp_path / "probe.pte").read_bytes()
