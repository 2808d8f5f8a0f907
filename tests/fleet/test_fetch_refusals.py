"""What ``fetch`` refuses before its first request, and how it names what an entry says:
a FIFO as a base (never waited on) or beside one (skipped); a base that is missing, a
directory or on a store, found before the index or the artifact is read; a directory at
``DEST`` or at its ``.ptd``'s path; a destination directory that cannot be made or
locked (a ``StorageError``, never a raw ``OSError``); an index entry naming another size
than its object's (an ``IntegrityError``, not a full disk, also for ``ensure``); a URL
fetched directly whose object is replaced after fetch read its trailer (read again and
started over once; its own trailer named in the error)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from support.fleet_backend import specialized_pair
from support.privileges import unprivileged

import ptestore
from ptestore.backends.compat import DeviceProfile
from ptestore.cli import main
from ptestore.errors import (
    ConfigurationError,
    IntegrityError,
    PermissionDenied,
    StorageError,
)
from ptestore.fleet import fetch as fetch_module
from ptestore.fleet.fetch import FetchEvent
from ptestore.fleet.index import entry_for
from ptestore.provenance import read_trailer
from ptestore.storage.loaders import BytesLoader

A = DeviceProfile("a", {"soc": "x", "scale": 2.0})


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Two small real pairs (.pte and .ptd) of the same sizes, for devices a and b."""
    d = tmp_path_factory.mktemp("pairs")
    return {"a": specialized_pair(d, "a", 2.0), "b": specialized_pair(d, "b", 3.0)}


def _index(directory: Path, pte: Path, ptd: Path, **fields: Any) -> Path:
    """A version 2 index naming the pair for model m on device a, its .pte entry's
    fields replaced by ``fields``."""
    entry = entry_for(str(pte), str(ptd), {})
    entry.update(model="m")
    entry["pte"].update(fields)
    path = directory / "ptestore-index.json"
    doc = {"format": "ptestore.index", "version": 2, "updated": "x", "entries": [entry]}
    path.write_text(json.dumps(doc))
    return path


def _fetch_in_a_thread(fifo: Path, **kwargs: Any) -> Any:
    """``ptestore.fetch(**kwargs)``'s result or exception, run in a thread: one that
    still runs after a generous ceiling (blocked opening ``fifo`` for reading, as it
    was: it waited for a writer forever) is released by opening the FIFO's other end,
    and the test fails; it never passes on a timeout."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = ptestore.fetch(**kwargs)
        except BaseException as exc:  # looked at below
            out["result"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(300)
    if thread.is_alive():
        with contextlib.suppress(OSError):  # a reader is waiting: this releases it
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(60)
        raise AssertionError(f"fetch blocked on the FIFO {fifo} (waiting for a writer)")
    return out["result"]


def test_a_fifo_base_is_refused_without_waiting_for_a_writer(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    pte, _ = pairs["a"]
    fifo = tmp_path / "base.pte"
    os.mkfifo(fifo)
    dest = tmp_path / "dev" / "m.pte"
    got = _fetch_in_a_thread(fifo, index_or_url=pte, dest=dest, base=fifo)
    assert isinstance(got, ConfigurationError)
    assert str(got) == (
        f"{fifo}: cannot be used as a base: {fifo}: is a FIFO (named pipe), not a regular "
        "file; refusing to read it"
    )
    assert not dest.parent.exists()


def test_a_fifo_beside_a_base_is_skipped_as_its_ptd(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """The ``.ptd`` beside a base is optional: a FIFO there is skipped as a missing
    one is (never opened to wait for a writer), the ``.pte``'s chunks still taken."""
    pte, ptd = pairs["a"]
    keep = tmp_path / "keep"
    keep.mkdir()
    shutil.copyfile(pte, keep / "m.pte")
    os.mkfifo(keep / "m.ptd")
    dest = tmp_path / "dev" / "m.pte"
    got = _fetch_in_a_thread(keep / "m.ptd", index_or_url=pte, dest=dest, base=keep / "m.pte")
    assert not isinstance(got, BaseException), got
    by_path = {f["path"]: f for f in got.files}
    assert by_path[str(dest.with_suffix(".ptd"))]["bases"] == {}
    trailer = read_trailer(BytesLoader(pte.read_bytes()))
    assert trailer is not None
    assert by_path[str(dest)]["bases"] == {str(keep / "m.pte"): trailer.content_size}
    assert dest.read_bytes() == pte.read_bytes()
    assert dest.with_suffix(".ptd").read_bytes() == ptd.read_bytes()


def test_a_base_that_cannot_be_used_is_refused_before_the_first_request(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the index is read (here there is none: its error would come first) and
    before the ``.ptd`` is downloaded (it used to be, then the base was refused)."""
    pte, _ = pairs["a"]
    dest = tmp_path / "dev" / "m.pte"
    missing = tmp_path / "nope.pte"
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(tmp_path / "no-index.json", dest, model="m", device=A, base=missing)
    assert str(info.value) == f"{missing}: no such base file (--base)"
    seen: list[FetchEvent] = []
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(pte, dest, base=[pte, tmp_path], events=seen.append)
    assert str(info.value).startswith(f"{tmp_path}: cannot be used as a base: {tmp_path}: ")
    assert seen == [] and not dest.parent.exists()
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(pte, dest, base="s3://bucket/m.pte")
    assert str(info.value) == (
        "s3://bucket/m.pte: a base must be a local file (fetch takes the chunks it holds "
        "from local disk), not a URL (--base)"
    )
    assert main(["fetch", str(pte), str(dest), "--base", "s3://bucket/m.pte"]) == 2
    assert "a base must be a local file" in capsys.readouterr().err
    assert not dest.parent.exists()


def test_a_directory_at_dest_or_at_its_ptd_is_refused_up_front(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before anything is downloaded (it used to be found by the rename of the
    .pte, after the .ptd was published: a partial publish a rerun did not fix)."""
    pte, _ = pairs["a"]
    dest = tmp_path / "dev" / "m.pte"
    (dest / "x").mkdir(parents=True)
    seen: list[FetchEvent] = []
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(pte, dest, events=seen.append)
    assert str(info.value) == (
        f"{dest}: is a directory; DEST is the path of the .pte fetch writes (its .ptd "
        "beside it), not a directory to put it in; nothing was downloaded"
    )
    assert seen == [] and sorted(os.listdir(dest.parent)) == ["m.pte"]
    assert main(["fetch", str(pte), str(dest)]) == 2
    assert capsys.readouterr().err.startswith(f"ptestore fetch: error: {dest}: is a directory; ")
    shutil.rmtree(dest)
    ptd_dest = dest.with_suffix(".ptd")
    ptd_dest.mkdir()
    with pytest.raises(ConfigurationError) as info:
        ptestore.fetch(pte, dest, events=seen.append)
    assert str(info.value) == (
        f"{ptd_dest}: is a directory; fetch publishes the .ptd of {dest} there: remove it "
        "or give another DEST; nothing was downloaded"
    )
    assert seen == [] and sorted(os.listdir(dest.parent)) == ["m.ptd"]


def test_a_destination_that_cannot_be_made_or_locked_is_a_storage_error(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """Never a raw ``OSError`` (``ensure``'s offline fallback takes ``StorageError``s)."""
    pte, _ = pairs["a"]
    (tmp_path / "file").write_bytes(b"x")
    dest = tmp_path / "file" / "m.pte"
    with pytest.raises(StorageError) as info:
        ptestore.fetch(pte, dest)
    where = tmp_path / "file"
    assert str(info.value) == f"{dest}: cannot make its directory {where}: a file is there"
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    err = tmp_path / "err.txt"
    err.touch()
    err.chmod(0o666)

    def run() -> int:
        try:
            ptestore.fetch(pte, read_only / "m.pte")
        except PermissionDenied as exc:
            err.write_text(str(exc))
            return 2
        return 0

    assert unprivileged(run) == 2
    assert err.read_text() == (
        f"{read_only}/m.pte.part.lock: cannot lock the fetch into {read_only}/m.pte: "
        "Permission denied"
    )
    assert os.listdir(read_only) == []


def test_an_entry_of_another_size_than_its_object_is_not_a_full_disk(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """An entry naming 10**20 bytes: no disk has room for that, but the object is not
    that size: an ``IntegrityError`` naming both sizes, nothing downloaded; ``ensure``
    does not serve the entry it has offline for it (not a local problem)."""
    pte, ptd = pairs["a"]
    index = _index(tmp_path, pte, ptd)
    cache = tmp_path / "cache"
    first = ptestore.ensure(str(index), cache_dir=cache, model="m", device=A)
    index = _index(tmp_path, pte, ptd, size=10**20)
    dest = tmp_path / "dev" / "m.pte"
    with pytest.raises(IntegrityError) as info:
        ptestore.fetch(index, dest, model="m", device=A)
    assert str(info.value) == (
        f"{pte}: the object is {pte.stat().st_size} bytes, the index names {10**20}"
    )
    assert info.value.published is False and not dest.parent.exists()
    with pytest.raises(IntegrityError) as info:
        ptestore.ensure(str(index), cache_dir=cache, model="m", device=A)
    assert str(info.value).startswith(f"{pte}: the object is {pte.stat().st_size} bytes, ")
    assert Path(first.pte).read_bytes() == pte.read_bytes()


def _trailer_sha(path: Path) -> str:
    trailer = read_trailer(BytesLoader(path.read_bytes()))
    assert trailer is not None
    return "sha256:" + trailer.sha256


def test_a_url_replaced_after_fetch_read_its_trailer_is_read_again_once(
    pairs: dict[str, tuple[Path, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The artifact at the URL (and its .ptd) is republished between fetch's reading
    its trailer and its download: the download refuses the new object before a content
    byte (its trailer is not the one read), fetch reads it again and starts over, and
    publishes the new pair. Replaced each time, it fails the second time, naming what
    the trailer was when fetch read it, not an index."""
    served = tmp_path / "store"
    served.mkdir()
    versions = {k: (p.read_bytes(), d.read_bytes()) for k, (p, d) in pairs.items()}
    pte, ptd = served / "m.pte", served / "m.ptd"

    def publish(which: str) -> None:
        pte.write_bytes(versions[which][0])
        ptd.write_bytes(versions[which][1])

    publish("a")
    real = fetch_module._describe
    swaps = iter(["b"])

    def describe_then_republish(url: str, options: dict[str, Any]) -> dict[str, Any]:
        got = real(url, options)
        which = next(swaps, None)
        if which is not None:
            publish(which)
        return got

    monkeypatch.setattr(fetch_module, "_describe", describe_then_republish)
    dest = tmp_path / "dev" / "m.pte"
    with caplog.at_level(logging.WARNING, "ptestore.fleet.fetch"):
        ptestore.fetch(pte, dest)
    a_sha = _trailer_sha(pairs["a"][0])
    b_sha = _trailer_sha(pairs["b"][0])
    assert caplog.messages == [
        f"{pte}: provenance trailer checksum {b_sha}, it was {a_sha} when fetch first read "
        "its trailer (the object was replaced since); reading its trailer again and "
        "fetching it from the start"
    ]
    assert dest.read_bytes() == versions["b"][0]
    assert dest.with_suffix(".ptd").read_bytes() == versions["b"][1]

    publish("a")
    swaps = iter(["b", "a"])
    with pytest.raises(IntegrityError) as info:
        ptestore.fetch(pte, tmp_path / "dev2" / "m.pte")
    assert str(info.value) == (
        f"{pte}: provenance trailer checksum {a_sha}, it was {b_sha} when fetch first read "
        "its trailer (the object was replaced since)"
    )
    assert info.value.published is False and not (tmp_path / "dev2" / "m.pte").exists()


def test_fetches_into_two_names_that_share_a_ptd_take_turns(
    pairs: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """DEST ``x/m`` and DEST ``x/m.pte`` both put their ``.ptd`` at ``x/m.ptd``: each fetch
    also holds ``x/m.ptd.part.lock``, so the second waits for the first instead of writing
    into the same ``.ptd.part`` (they took different ``DEST.part.lock`` only)."""
    from support.locks import blocked_on, wait_until

    from ptestore.fleet import chunked

    pte, _ = pairs["a"]
    out = tmp_path / "x"
    paused, go = threading.Event(), threading.Event()
    real = chunked._fetch_run
    outcomes: dict[str, object] = {}

    def first_pauses(*args: Any) -> Any:
        if threading.current_thread().name == "first" and not paused.is_set():
            paused.set()  # mid-download of its .ptd (fetched first), nothing verified yet
            assert go.wait(120)
        return real(*args)

    def run(name: str, dest: Path) -> None:
        try:
            outcomes[name] = ptestore.fetch(pte, dest)
        except BaseException as exc:  # reported below
            outcomes[name] = exc

    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunked, "_fetch_run", first_pauses)
        first = threading.Thread(target=run, args=("first", out / "m"), name="first")
        first.start()
        wait_until(paused.is_set, "the first fetch to start downloading")
        part = out / "m.ptd.part"
        inode = part.stat().st_ino
        second = threading.Thread(target=run, args=("second", out / "m.pte"), name="second")
        second.start()
        lock = out / "m.ptd.part.lock"
        wait_until(lambda: blocked_on(lock), "the second fetch to wait for the first")
        assert part.stat().st_ino == inode  # the first one's .ptd.part, untouched
        go.set()
        first.join()
        second.join()
    assert all(not isinstance(o, BaseException) for o in outcomes.values()), outcomes
    assert sorted(p.name for p in out.iterdir()) == ["m", "m.ptd", "m.pte"]
