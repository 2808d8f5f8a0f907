"""``fetch`` against index entries that lie and against itself: two fetches into one
destination take turns (a second one waits on ``DEST.part.lock`` before it touches the
first one's ``.part``); a malformed entry is refused before the first request; a
whole-checked file whose size the index misnames, or an entry whose digest is not the
one its pinned trailer records, is refused before a byte is downloaded; a whole
download resumes only a ``.part`` of the bytes the index names; a resume marker that
counts more chunks than there are keeps only those there are. A 20 MiB artifact (six
4 MiB chunks) whose next version differs in one chunk."""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from support.delta import program, version
from support.digests import tree
from support.locks import blocked_on, wait_until

import ptestore
from ptestore.errors import ConfigurationError, FormatError, IntegrityError, StorageError
from ptestore.fleet import chunked
from ptestore.fleet.fetch import FetchResult
from ptestore.fleet.index import entry_for
from ptestore.provenance.chunks import CHUNK_SIZE


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("versions")
    src = program(d)
    return version(src, d / "a" / "m.pte", "1"), version(src, d / "b" / "m.pte", "2")


def _index(directory: Path, artifact: Path, **pte: Any) -> Path:
    """A v2 index naming ``artifact`` for model m on device a, its .pte entry's fields
    replaced by ``pte`` (a value of ``...`` removes the field)."""
    entry = entry_for(str(artifact), None, {})
    entry.update(model="m", device="a")
    for key, value in pte.items():
        if value is ...:
            entry["pte"].pop(key)
        else:
            entry["pte"][key] = value
    path = directory / "ptestore-index.json"
    doc = {"format": "ptestore.index", "version": 2, "updated": "x", "entries": [entry]}
    path.write_text(json.dumps(doc))
    return path


def test_two_fetches_into_one_destination_take_turns(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    _, b = versions
    dest = tmp_path / "m.pte"
    paused, go = threading.Event(), threading.Event()
    real = chunked._fetch_run
    outcomes: dict[str, object] = {}

    def first_pauses(*args: Any) -> Any:
        if threading.current_thread().name == "first" and not paused.is_set():
            paused.set()  # mid-download, its .part open and nothing verified yet
            assert go.wait(120)
        return real(*args)

    def run(name: str) -> None:
        try:
            outcomes[name] = ptestore.fetch(b, dest)
        except BaseException as exc:  # reported below
            outcomes[name] = exc

    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunked, "_fetch_run", first_pauses)
        first = threading.Thread(target=run, args=("first",), name="first", daemon=True)
        first.start()
        wait_until(paused.is_set, "the first fetch to start downloading")
        part = Path(f"{dest}.part")
        inode = part.stat().st_ino
        second = threading.Thread(target=run, args=("second",), name="second", daemon=True)
        second.start()
        lock = Path(f"{dest}.part.lock")
        wait_until(lambda: blocked_on(lock), "the second fetch to wait for the first")
        assert part.stat().st_ino == inode  # the first one's .part, untouched
        go.set()
        first.join()
        second.join()
    assert all(isinstance(o, FetchResult) for o in outcomes.values()), outcomes
    assert dest.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pte"]  # the lock went too


def test_a_link_at_the_fetch_lock_is_refused(versions: tuple[Path, Path], tmp_path: Path) -> None:
    _, b = versions
    victim = tmp_path / "victim"
    (tmp_path / "m.pte.part.lock").symlink_to(victim)
    with pytest.raises(ptestore.PermissionDenied) as err:
        ptestore.fetch(b, tmp_path / "m.pte")
    assert str(err.value) == (
        f"{tmp_path}/m.pte.part.lock: is a symbolic link (to {str(victim)!r}); fetch does "
        "not write through links at its download files: remove it and fetch again"
    )
    assert not victim.exists() and not (tmp_path / "m.pte").exists()


HEX = "0" * 64


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"trailer_sha256": None, "sha256": "md5:00"},
            "{url}: index entry sha256 = 'md5:00': must be 'sha256-tree:' or 'sha256:' and "
            "64 lowercase hex",
        ),
        (
            {"trailer_sha256": None, "sha256": 5},
            "{url}: index entry sha256 = 5: must be 'sha256-tree:' or 'sha256:' and 64 "
            "lowercase hex",
        ),
        (
            {"trailer_sha256": 7},
            "{url}: index entry trailer_sha256 = 7: must be null or 'sha256:' and 64 lowercase hex",
        ),
        (
            {"trailer_sha256": "sha256-tree:" + HEX},
            f"{{url}}: index entry trailer_sha256 = 'sha256-tree:{HEX}': must be null or "
            "'sha256:' and 64 lowercase hex",
        ),
        ({"size": -1}, "{url}: index entry size = -1: must be a byte count >= 0"),
        ({"size": "12"}, "{url}: index entry size = '12': must be a byte count >= 0"),
        ({"size": True}, "{url}: index entry size = True: must be a byte count >= 0"),
        ({"url": ...}, "{index}: entry m/a pte.url = None: must be a URL or path"),
        (
            {"trailer_sha256": ...},
            "{index}: entry m/a pte.trailer_sha256 = None: must be present: null (a file "
            "without a trailer) or 'sha256:' and 64 lowercase hex (the entry has none: its "
            "download was checked as a file without a trailer and said to be damaged)",
        ),
        ({"url": 3}, "{index}: entry m/a pte.url = 3: must be a URL or path"),
    ],
)
def test_a_malformed_entry_is_refused_before_the_first_request(
    versions: tuple[Path, Path],
    tmp_path: Path,
    fields: dict[str, Any],
    message: str,
) -> None:
    _, b = versions
    index = _index(tmp_path, b, **copy.deepcopy(fields))
    dest = tmp_path / "out" / "m.pte"
    with pytest.raises(FormatError) as err:
        ptestore.fetch(index, dest, model="m", device="a")
    assert str(err.value) == message.format(url=b, index=index)
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []


def test_an_entry_without_its_trailer_digest_is_bad_input_not_damage(
    versions: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .pte entry without ``trailer_sha256`` was checked as a file without a trailer:
    its whole bytes against the content's digest, "downloaded bytes have ..., the index
    names ...", exit 1 (rerunning never helps). Refused before the first request, exit 2,
    by fetch and ensure (select, which downloads nothing, still answers)."""
    from ptestore.cli import main

    _, b = versions
    index = _index(tmp_path, b, trailer_sha256=...)
    dest = tmp_path / "out" / "m.pte"
    said = (
        f"{index}: entry m/a pte.trailer_sha256 = None: must be present: null (a file "
        "without a trailer) or 'sha256:' and 64 lowercase hex (the entry has none: its "
        "download was checked as a file without a trailer and said to be damaged)"
    )
    asked = ["--model", "m", "--device", "a"]
    capsys.readouterr()
    assert main(["fetch", str(index), str(dest), *asked]) == 2
    assert capsys.readouterr().err == f"ptestore fetch: error: {said}\n"
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
    cache = tmp_path / "cache"
    assert main(["ensure", str(index), *asked, "--cache-dir", str(cache)]) == 2
    assert capsys.readouterr().err == f"ptestore ensure: error: {said}\n"
    assert main(["select", str(index), *asked]) == 0


def test_a_whole_checked_file_of_another_size_is_refused_before_a_byte(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    _, b = versions
    index = _index(tmp_path, b, size=1, trailer_sha256=None)
    moved: list[int] = []
    with pytest.raises(IntegrityError) as err:
        ptestore.fetch(
            index,
            tmp_path / "out" / "m.pte",
            model="m",
            device="a",
            progress=lambda url, done, total: moved.append(done),
        )
    assert str(err.value) == f"{b}: the object is {b.stat().st_size} bytes, the index names 1"
    assert moved == [] and err.value.published is False


def test_an_entry_whose_digest_is_not_its_trailer_s_is_refused_before_a_byte(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """The trailer the entry pins records the content's digest: an entry naming other
    bytes (``sha256``) is refused once the trailer is read, before any content byte."""
    _, b = versions
    claimed = "sha256-tree:" + "ab" * 32
    index = _index(tmp_path, b, sha256=claimed)
    actual = entry_for(str(b), None, {})["pte"]["sha256"]
    moved: list[int] = []
    dest = tmp_path / "out" / "m.pte"
    with pytest.raises(IntegrityError) as err:
        ptestore.fetch(
            index, dest, model="m", device="a", progress=lambda url, d, t: moved.append(d)
        )
    assert str(err.value) == (
        f"{b}: the record in its trailer (the one the index pins) names its bytes {actual}, "
        f"the index names {claimed}"
    )
    assert moved == [] and err.value.published is False and not dest.exists()


def test_a_whole_download_resumes_only_a_part_of_the_bytes_the_index_names(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    """An index updated to name other bytes of a file checked whole, in place at the
    same size and time (as a store without versions pins it: by URL and size): the
    ``.part`` of the earlier bytes is not resumed, its digest is pinned too."""
    from ptestore.fleet.ranged import PinnedReader

    a, _ = versions
    served = tmp_path / "store" / "m.pte"
    served.parent.mkdir()
    old = a.read_bytes()
    served.write_bytes(old)
    dest = tmp_path / "out" / "m.pte"
    real = PinnedReader.stream

    def cut_at_8_mib(self: Any, start: int, end: int, piece: int) -> Any:
        if start >= 2 * CHUNK_SIZE:
            raise StorageError("the network went away")
        return real(self, start, end, piece)

    index = _index(tmp_path, served, trailer_sha256=None, sha256=tree(old))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(PinnedReader, "stream", cut_at_8_mib)
        with pytest.raises(StorageError):
            ptestore.fetch(index, dest, model="m", device="a", chunk_size=CHUNK_SIZE)
    assert Path(f"{dest}.part").stat().st_size == 2 * CHUNK_SIZE
    new = bytearray(old)
    new[1 << 20] ^= 1  # within the .part, far from its last 64 KiB
    st = served.stat()
    with open(served, "r+b") as f:  # the same inode, size and mtime
        f.write(new)
    os.utime(served, ns=(st.st_atime_ns, st.st_mtime_ns))
    index = _index(tmp_path, served, trailer_sha256=None, sha256=tree(new))
    got = ptestore.fetch(index, dest, model="m", device="a")
    assert got.files[0]["resumed_from"] == 0
    assert dest.read_bytes() == new


def test_a_marker_counting_more_chunks_than_there_are_keeps_those_there_are(
    versions: tuple[Path, Path], tmp_path: Path
) -> None:
    _, b = versions
    dest = tmp_path / "m.pte"
    real = chunked._fetch_run
    calls = [0]

    def second_run_fails(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:
            raise StorageError("the network went away")
        return real(*args)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunked, "_fetch_run", second_run_fails)
        with pytest.raises(StorageError):
            ptestore.fetch(b, dest, chunk_size=2 * CHUNK_SIZE)
    marker = Path(f"{dest}.part.json")
    state = json.loads(marker.read_text())
    assert state["verified"] == 2
    state["verified"] = 9  # the artifact has 6 chunks
    marker.write_text(json.dumps(state))
    got = ptestore.fetch(b, dest)
    assert got.files[0]["resumed_from"] == 2 * CHUNK_SIZE
    assert dest.read_bytes() == b.read_bytes()


def test_a_file_url_dest_and_base_are_the_local_paths_they_name(
    versions: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file:///x/m.pte`` as DEST (and as --base) is ``/x/m.pte``: the download, its
    resume marker and its lock are there, nothing under the current directory."""
    a, b = versions
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    dest = tmp_path / "dev" / "m.pte"
    result = ptestore.fetch(b, f"file://{dest}", base=f"file://{a}")
    assert dest.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["m.pte"]
    assert list(cwd.iterdir()) == []
    assert result.files[0]["path"] == str(dest)
    assert result.from_base == result.files[0]["bases"][str(a)] > 0


def test_a_dest_ending_in_a_slash_is_refused(versions: tuple[Path, Path], tmp_path: Path) -> None:
    """``DEST/`` names a directory: refused before anything is made (before, the
    download went to ``DEST/.part`` in a directory made for it)."""
    _, b = versions
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(b, f"{tmp_path}/dev/m.pte/")
    assert str(info.value) == (
        f"{tmp_path}/dev/m.pte/: names a directory (it ends in '/'), not a file"
    )
    assert not (tmp_path / "dev").exists()
