"""``ptestore.ensure``: specialize once into a cache directory, then hit without reading
the source; stale entries, racing processes, a killed holder, eviction, a full disk."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.blocks import allocated
from support.digests import tree
from support.fixtures import copy_pte, get_fixture
from support.large import ReplaceKey, inflate
from support.smallfs import tmpfs

import ptestore
from ptestore.backends import BackendInterface
from ptestore.backends.compat import DeviceProfile
from ptestore.device import clear, evict, list_entries, prune
from ptestore.device.keys import entry_key
from ptestore.errors import BackendError, ConfigurationError, ObjectNotFound, StorageError

SPEC = "support.counting_backend:Counting=1.0"
DEVICE = DeviceProfile("phone", {"scale": 2.0, "soc": "sm8650"})
TESTS = Path(__file__).resolve().parents[1]
FX_PTE = get_fixture("mlp_xnnpack").pte_path
KEY = get_fixture("mlp_xnnpack").doubled.key  # type: ignore[union-attr]


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file every backend call appends a line to (in this and child processes)."""
    path = tmp_path / "calls.txt"
    monkeypatch.setenv("PTESTORE_TEST_CALLS", str(path))
    monkeypatch.delenv("PTESTORE_TEST_HOLD", raising=False)
    return path


def ncalls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def model(tmp_path: Path, name: str = "model.pte") -> Path:
    return copy_pte(tmp_path / name)


def sha(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_first_call_specializes_later_calls_hit_without_reading_the_source(
    tmp_path: Path, calls: Path
) -> None:
    src = model(tmp_path)
    cache = tmp_path / "cache"
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert a.created and a.specialized and ncalls(calls) == 1
    assert a.ptd is None and Path(a.pte).parent.parent == cache / "entries"
    assert a.provenance.device is not None and a.provenance.device.digest == DEVICE.digest()
    assert a.provenance.source.sha256 == tree(Path(src).read_bytes())
    assert a.provenance.requested[0].spec == SPEC
    made = Path(a.pte).read_bytes()
    # A hit trusts the identity and never reads the bytes: no loader is opened.
    from ptestore.storage.loaders import LocalFileLoader

    def no_read(self: object, path: object, *args: object, **kw: object) -> None:
        raise AssertionError(f"a hit read {path}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalFileLoader, "__init__", no_read)
        b = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert not b.created and b.pte == a.pte and ncalls(calls) == 1
    assert b.provenance == a.provenance and Path(b.pte).read_bytes() == made


def test_a_changed_source_backend_version_or_device_re_specializes_only_that_entry(
    tmp_path: Path, calls: Path
) -> None:
    cache = tmp_path / "cache"
    one, two = model(tmp_path, "one.pte"), model(tmp_path, "two.pte")
    a1 = ptestore.ensure(one, cache_dir=cache, backends=[SPEC], device=DEVICE)
    a2 = ptestore.ensure(two, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert a1.key != a2.key and ncalls(calls) == 2
    two_bytes = Path(a2.pte).read_bytes()

    os.utime(one, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: identity changed
    b1 = ptestore.ensure(one, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert b1.created and b1.key == a1.key and ncalls(calls) == 3
    b2 = ptestore.ensure(two, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert not b2.created and Path(b2.pte).read_bytes() == two_bytes and ncalls(calls) == 3

    v2 = "support.counting_backend:Counting=2.0"
    c1 = ptestore.ensure(one, cache_dir=cache, backends=[v2], device=DEVICE)
    assert c1.created and ncalls(calls) == 4
    assert [r.version for r in c1.provenance.requested] == ["2.0"]

    other = DeviceProfile("phone", {"scale": 3.0, "soc": "sm8650"})
    d1 = ptestore.ensure(one, cache_dir=cache, backends=[v2], device=other)
    assert d1.created and d1.key == c1.key and ncalls(calls) == 5
    assert d1.provenance.device is not None
    assert d1.provenance.device.digest == other.digest()
    # Stale entries are made again in their place: the cache does not grow.
    assert {e.key for e in list_entries(cache)} == {a1.key, a2.key, c1.key}
    assert not ptestore.ensure(one, cache_dir=cache, backends=[v2], device=other).created
    assert ncalls(calls) == 5


def test_a_file_changed_in_the_cache_is_a_miss_not_a_hit(tmp_path: Path, calls: Path) -> None:
    src, cache = model(tmp_path), tmp_path / "cache"
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    Path(a.pte).write_bytes(b"not a model")
    b = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert b.created and ncalls(calls) == 2
    assert Path(b.pte).read_bytes()[4:8] == b"ET12"


_CHILD = textwrap.dedent(
    """
    import json, sys
    import ptestore
    from ptestore.backends.compat import DeviceProfile
    a = ptestore.ensure(sys.argv[1], cache_dir=sys.argv[2], backends=[sys.argv[3]],
                        device=DeviceProfile("phone", {"scale": 2.0, "soc": "sm8650"}))
    print(json.dumps({"pte": a.pte, "created": a.created}))
    """
)


def _child(src: Path, cache: Path, hold: float = 0.0) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(TESTS), PTESTORE_TEST_HOLD=str(hold))
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(src), str(cache), SPEC],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(pred: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_racing_processes_specialize_once(tmp_path: Path, calls: Path) -> None:
    src, cache = model(tmp_path), tmp_path / "cache"
    procs = [_child(src, cache, hold=0.5) for _ in range(3)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert ncalls(calls) == 1
    assert len({o["pte"] for o in outs}) == 1
    assert sorted(o["created"] for o in outs) == [False, False, True]


def test_a_holder_killed_mid_run_does_not_block_the_others(tmp_path: Path, calls: Path) -> None:
    src, cache = model(tmp_path), tmp_path / "cache"
    holder = _child(src, cache, hold=60.0)
    _wait_for(lambda: ncalls(calls) == 1)  # inside the backend: the key is locked
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    t0 = time.monotonic()
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert a.created and ncalls(calls) == 2
    assert time.monotonic() - t0 < 30
    # The killed run's staging files were cleaned up under the lock.
    assert sorted(os.listdir(Path(a.pte).parent)) == ["manifest.json", "model.pte"]


def _entry_bytes(cache: Path, key: str) -> int:
    d = cache / "entries" / key
    return sum(p.stat().st_size for p in d.iterdir())


def test_max_bytes_evicts_least_recently_used_never_the_one_returned(
    tmp_path: Path, calls: Path
) -> None:
    cache = tmp_path / "cache"
    srcs = [model(tmp_path, f"m{i}.pte") for i in range(3)]
    a = ptestore.ensure(srcs[0], cache_dir=cache, backends=[SPEC], device=DEVICE)
    time.sleep(0.01)
    b = ptestore.ensure(srcs[1], cache_dir=cache, backends=[SPEC], device=DEVICE)
    time.sleep(0.01)
    assert not ptestore.ensure(srcs[0], cache_dir=cache, backends=[SPEC], device=DEVICE).created
    size = _entry_bytes(cache, a.key)
    # Room for two entries: the least recently used (b; a was just used) goes.
    c = ptestore.ensure(
        srcs[2], cache_dir=cache, backends=[SPEC], device=DEVICE, max_bytes=2 * size + 100
    )
    assert {e.key for e in list_entries(cache)} == {a.key, c.key}
    assert not (cache / "entries" / b.key).exists()
    # max_bytes=0: everything but the entry returned.
    d = ptestore.ensure(srcs[1], cache_dir=cache, backends=[SPEC], device=DEVICE, max_bytes=0)
    assert d.created and [e.key for e in list_entries(cache)] == [d.key]
    assert Path(d.pte).exists()


def test_an_entry_another_process_holds_is_not_evicted(tmp_path: Path, calls: Path) -> None:
    cache = tmp_path / "cache"
    a = ptestore.ensure(model(tmp_path, "a.pte"), cache_dir=cache, backends=[SPEC])
    from ptestore.device.layout import CacheLayout

    with CacheLayout(cache).lock(a.key, shared=True):
        done = evict(cache, 0)
    assert done.busy == [a.key] and done.removed == []
    assert evict(cache, 0).removed == [a.key]


def test_prune_removes_incomplete_entries_and_leftovers(tmp_path: Path, calls: Path) -> None:
    cache = tmp_path / "cache"
    a = ptestore.ensure(model(tmp_path), cache_dir=cache, backends=[SPEC])
    leftover = Path(a.pte).parent / ".model.pte.ptestore-0123456789abcdef.tmp"
    leftover.write_bytes(b"x" * 100)
    half = cache / "entries" / ("0" * 32)
    half.mkdir()
    (half / "model.pte").write_bytes(b"partial")
    held = allocated(half / "model.pte") + allocated(leftover)
    done = prune(cache)
    assert done.removed == ["0" * 32] and not half.exists() and not leftover.exists()
    # Freed: what the incomplete entry's 7 bytes and the ready entry's 100-byte leftover
    # held on the file system (a block each).
    assert done.freed == held > 0
    assert [e.state for e in list_entries(cache)] == ["ready"]
    assert clear(cache).removed == [a.key] and list_entries(cache) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_bytes": -1}, "max_bytes must be an integer >= 0 or None, got -1"),
        ({"max_bytes": True}, "max_bytes must be an integer >= 0 or None, got True"),
        ({"device": "phone"}, "device must be a DeviceProfile or None, got str"),
        ({"cache_dir": "s3://bucket/c"}, "the cache is a local directory, not a URL"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    tmp_path: Path, calls: Path, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"cache_dir": tmp_path / "cache", "backends": [SPEC], **kwargs}
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ptestore.ensure(model(tmp_path), **args)  # type: ignore[arg-type]
    assert ncalls(calls) == 0


_PATHS = "must be a path or URL (a str or os.PathLike), got "


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"backends": "my-npu"},
            "backends must be a list of backend SPECs or objects, got the str 'my-npu' "
            "(iterated, it would be read an item at a time, each character a backend): "
            "pass backends=['my-npu']",
        ),
        ({"source": None}, "source " + _PATHS + "None"),
        ({"source": 3}, "source " + _PATHS + "int 3"),
        ({"source": b"m.pte"}, "source " + _PATHS + "bytes b'm.pte'"),
        ({"cache_dir": None}, "cache_dir " + _PATHS + "None"),
        ({"cache_dir": 7}, "cache_dir " + _PATHS + "int 7"),
        ({"ptd": b"m.ptd"}, "ptd " + _PATHS + "bytes b'm.ptd'"),
        ({"portable": 1, "in_place": True}, "portable " + _PATHS + "int 1"),
    ],
)
def test_misused_arguments_are_named_not_a_bare_type_error(
    tmp_path: Path, calls: Path, kwargs: dict[str, object], message: str
) -> None:
    """A backend list given as one string (it used to be read one character a backend:
    "backend 'm': unknown name"), a path given as None, an int or bytes (a bare
    TypeError from inside): a ConfigurationError naming the argument, before any work."""
    args: dict[str, object] = {
        "source": model(tmp_path),
        "cache_dir": tmp_path / "cache",
        "backends": [SPEC],
        **kwargs,
    }
    with pytest.raises(ConfigurationError) as err:
        ptestore.ensure(**args)  # type: ignore[arg-type]
    assert str(err.value) == message
    assert ncalls(calls) == 0 and not (tmp_path / "cache").exists()
    if "cache_dir" in kwargs:
        with pytest.raises(ConfigurationError) as err:
            list_entries(kwargs["cache_dir"])  # type: ignore[arg-type]
        assert str(err.value) == message


def test_a_missing_source_names_it(tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound, match=r"nope\.pte: no such file"):
        ptestore.ensure(tmp_path / "nope.pte", cache_dir=tmp_path / "cache")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards."""
    with tmpfs(tmp_path / "small", "1m") as mnt:
        yield mnt


@pytest.mark.filterwarnings("ignore:.*encountered in multiply:RuntimeWarning")
def test_a_full_disk_is_a_clear_error_with_cache_and_source_intact(
    tmp_path: Path, small_fs: Path, calls: Path
) -> None:
    cache = small_fs / "cache"
    src = model(tmp_path)
    small = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    fx = get_fixture("mlp_xnnpack")
    big = tmp_path / "big.pte"
    inflate(fx.pte_path, big, 1 << 20)  # 2 keys of 1 MiB: more than the file system holds
    before = sha(big)
    with pytest.raises(StorageError) as err:
        ptestore.ensure(big, cache_dir=cache, backends=[SPEC], device=DEVICE)
    msg = str(err.value)
    # The bytes named are true together: the free space is what is left once the run
    # removed its partial copy (more than the source's size, maybe: the copy and the
    # spooled replacements filled the disk), and it says so.
    free = os.statvfs(cache).f_bavail * os.statvfs(cache).f_frsize
    assert msg.startswith(
        f"{small_fs}/cache: no space left on the file system for the specialized copy of "
        f"{big} (it needs about {big.stat().st_size} bytes, the source's size, and room "
        f"for the replaced bytes while they are spooled; {free} bytes are free now, the "
        "partial copy removed); the cache and the source are unchanged. Free space "
        "(`ptestore cache prune --max-bytes N`) or specialize in place (--in-place): "
    ), msg
    assert sha(big) == before
    # Only the first entry remains: nothing staged, no empty directory of the new key
    # (it was left, an "incomplete" entry).
    assert [(e.key, e.state) for e in list_entries(cache)] == [(small.key, "ready")]
    again = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    assert not again.created and sha(again.pte) == sha(small.pte)


def test_a_file_system_without_room_for_the_entry_directory_says_so(tmp_path: Path) -> None:
    """Out of inodes: the key's lock file is made, the entry's directory is not (a real
    ENOSPC of ``mkdir``). The message names no bytes needed (none are known)."""
    src = model(tmp_path)
    with tmpfs(tmp_path / "small", "1m,nr_inodes=64") as mnt:
        cache = mnt / "cache"
        ptestore.ensure(model(tmp_path, "other.pte"), cache_dir=cache, backends=[SPEC])
        filler = mnt / "filler"
        filler.mkdir()
        made = []
        try:
            while True:
                made.append(filler / str(len(made)))
                made[-1].touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        made.pop()
        made.pop().unlink()  # one inode: the new key's lock file
        with pytest.raises(StorageError) as err:
            ptestore.ensure(src, cache_dir=cache, backends=[SPEC])
        free = os.statvfs(cache).f_bavail * os.statvfs(cache).f_frsize
        key = entry_key(str(src), None, [SPEC], None, False, True)
        assert str(err.value) == (
            f"{cache}: no space left on the file system for the entry directory of {src} "
            f"(no inode was free when it failed, {free} bytes were); the cache and the "
            "source are "
            "unchanged. Free space (`ptestore cache prune --max-bytes N`) or specialize in "
            f"place (--in-place): {cache}/entries/{key}: cannot create the cache entry's "
            "directory: No space left on device"
        )
        assert not (cache / "entries" / key).exists()


class ScratchFull(BackendInterface):
    """A backend whose own scratch file system (not the cache's) fills up: the real
    ``OSError(ENOSPC)`` of its own write, not caught."""

    name = "XnnpackBackend"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        with open(self.scratch / "work.bin", "wb") as f:
            while True:
                f.write(bytes(1 << 16))


@pytest.mark.parametrize("in_place", [False, True])
def test_a_backends_own_full_disk_is_its_failure_not_the_caches(
    tmp_path: Path, small_fs: Path, in_place: bool
) -> None:
    """ENOSPC raised inside the backend's call by its own code, about its own scratch
    path on another file system: a BackendError the app catches as the backend's, never
    the cache's full disk (whose advice, prune the cache, would be wrong)."""
    src = model(tmp_path)
    before = sha(src)
    cache = tmp_path / "cache"
    with pytest.raises(BackendError) as err:
        ptestore.ensure(src, cache_dir=cache, backends=[ScratchFull(small_fs)], in_place=in_place)
    assert str(err.value) == (
        f"backend 'XnnpackBackend' ({ScratchFull.__module__}:ScratchFull): "
        "initialize_backend_data failed: OSError: [Errno 28] No space left on device"
    )
    assert sha(src) == before and all(e.state != "ready" for e in list_entries(cache))


def test_the_in_place_journal_filling_the_disk_inside_the_call_is_still_a_full_disk(
    tmp_path: Path, small_fs: Path
) -> None:
    """The cache's side of the same walk: the in-place journal (beside the model, on a
    1 MiB file system) filled by a replacement the backend submits inside its call is
    the full disk it is, not the backend's failure."""
    src = copy_pte(small_fs / "model.pte")
    before = sha(src)
    backend = ReplaceKey("XnnpackBackend", KEY, extra=2 << 20, alignment=64)
    with pytest.raises(StorageError) as err:
        ptestore.ensure(src, cache_dir=tmp_path / "cache", backends=[backend], in_place=True)
    assert not isinstance(err.value, BackendError)
    assert str(err.value).startswith(
        f"{src}: no space left on the file system for the in-place journal (the replaced "
        "bytes and the new metadata) or the space its writes need; the file is unchanged: "
    ), str(err.value)
    assert sha(src) == before and sorted(os.listdir(small_fs)) == ["model.pte"]


def test_a_remote_source_is_keyed_on_what_the_store_reports(tmp_path: Path, calls: Path) -> None:
    """fsspec's memory store reports no ETag or version: the identity is the SHA-256 (one
    read of the object per call, no specialization on a hit)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    url = "memory://device-test/model.pte"
    assert FX_PTE is not None
    fs.pipe(url, FX_PTE.read_bytes())
    cache = tmp_path / "cache"
    try:
        a = ptestore.ensure(url, cache_dir=cache, backends=[SPEC], device=DEVICE)
        b = ptestore.ensure(url, cache_dir=cache, backends=[SPEC], device=DEVICE)
        assert a.created and not b.created and ncalls(calls) == 1
        assert a.provenance.source.url == url
        data = bytearray(FX_PTE.read_bytes())
        data[-1] ^= 1  # another model (a byte of the last weight)
        fs.pipe(url, bytes(data))
        c = ptestore.ensure(url, cache_dir=cache, backends=[SPEC], device=DEVICE)
        assert c.created and c.key == a.key and ncalls(calls) == 2
        assert c.provenance.source.sha256 == tree(data)
    finally:
        fs.rm("memory://device-test", recursive=True)


def test_a_damaged_manifest_is_broken_a_miss_and_its_error_names_the_field(
    tmp_path: Path, calls: Path
) -> None:
    from ptestore.device.layout import read_manifest
    from ptestore.errors import FormatError

    src, cache = model(tmp_path), tmp_path / "cache"
    a = ptestore.ensure(src, cache_dir=cache, backends=[SPEC])
    manifest = Path(a.pte).parent / "manifest.json"
    manifest.write_text('{"format": "something else", "version": 1}')
    with pytest.raises(FormatError, match=r"manifest format.*'ptestore\.cache-entry'") as err:
        read_manifest(str(manifest))
    assert str(manifest) in str(err.value)
    assert [e.state for e in list_entries(cache)] == ["broken"]
    b = ptestore.ensure(src, cache_dir=cache, backends=[SPEC])
    assert b.created and ncalls(calls) == 2 and [e.state for e in list_entries(cache)] == ["ready"]
    manifest.write_text("not json")
    with pytest.raises(FormatError, match="manifest"):
        read_manifest(str(manifest))


def test_provenance_is_the_default_and_no_provenance_is_an_entry_of_its_own(
    tmp_path: Path, calls: Path
) -> None:
    from ptestore.provenance import read_trailer
    from ptestore.storage.loaders import LocalFileLoader

    src = model(tmp_path)
    cache = tmp_path / "cache"
    with_prov = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    bare = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE, provenance=False)
    assert with_prov.provenance is not None and bare.provenance is None
    assert bare.created and bare.key != with_prov.key and ncalls(calls) == 2
    for artifact, trailed in ((with_prov, True), (bare, False)):
        with LocalFileLoader(artifact.pte) as loader:
            assert (read_trailer(loader) is not None) is trailed
    again = ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE, provenance=False)
    assert not again.created and again.pte == bare.pte and again.provenance is None
    assert again.to_dict()["provenance"] is None and ncalls(calls) == 2
    # In place without provenance: the source is rewritten, no trailer added.
    inplace = ptestore.ensure(
        src, cache_dir=cache, backends=[SPEC], device=DEVICE, in_place=True, provenance=False
    )
    assert inplace.created and inplace.provenance is None
    with LocalFileLoader(str(src)) as loader:
        assert read_trailer(loader) is None
    with pytest.raises(ConfigurationError) as info:
        ptestore.ensure(src, cache_dir=cache, provenance="no")  # type: ignore[arg-type]
    assert str(info.value) == "provenance must be True or False, got 'no'"


# --- what review 74 found (stop 46) ---------------------------------------------------


def test_backend_instances_set_up_differently_make_two_entries(tmp_path: Path) -> None:
    """The key named an instance by its class only: ``CommandBackend("cat")`` made the
    entry, and one whose command appends bytes was served that file. An instance is
    keyed by its settings where its class says them (its ``repr``); two set up alike
    share the entry."""
    from ptestore.backends.command import CommandBackend

    src = copy_pte(tmp_path / "m.pte")
    cache = tmp_path / "cache"
    plain = ptestore.ensure(src, cache_dir=cache, backends=[CommandBackend("cat")])
    extra = CommandBackend(["sh", "-c", "cat; printf EXTRA"])
    other = ptestore.ensure(src, cache_dir=cache, backends=[extra])
    assert plain.created and other.created and plain.key != other.key
    assert Path(plain.pte).read_bytes() != Path(other.pte).read_bytes()
    again = ptestore.ensure(src, cache_dir=cache, backends=[CommandBackend("cat")])
    assert not again.created and again.key == plain.key
    aligned = CommandBackend("cat", alignment=64)
    assert repr(aligned) == "CommandBackend('cat', name='*', alignment=64)"
    assert ptestore.ensure(src, cache_dir=cache, backends=[aligned]).key != plain.key


def test_an_entry_directory_that_cannot_be_made_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was an ``UnboundLocalError`` (the message named a variable never set); the
    access refused is classified as the cache directory's (test_entry_dir_errors)."""
    import errno as errno_

    from ptestore.device import layout
    from ptestore.device.layout import CacheLayout
    from ptestore.errors import PermissionDenied

    src = copy_pte(tmp_path / "m.pte")
    cache = tmp_path / "cache"
    CacheLayout(cache).create()
    made = os.makedirs

    def refused(path: str, *args: Any, **kwargs: Any) -> None:
        if os.path.dirname(path) == str(cache / "entries"):
            raise PermissionError(errno_.EACCES, "Permission denied", path)
        made(path, *args, **kwargs)

    monkeypatch.setattr(layout.os, "makedirs", refused)
    with pytest.raises(PermissionDenied) as info:
        ptestore.ensure(src, cache_dir=cache, backends=[SPEC], device=DEVICE)
    [key] = [p.name[: -len(".lock")] for p in (cache / "locks").iterdir()]
    where = cache / "entries" / key
    assert (
        str(info.value) == f"{where}: cannot create the cache entry's directory: Permission denied"
    )


def test_an_entry_that_cannot_be_evicted_is_kept_and_the_new_one_returned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock file replaced by a link in another entry made ``ensure --max-bytes`` fail
    "nothing published" after it had made its own entry."""
    first = copy_pte(tmp_path / "a.pte")
    second = copy_pte(tmp_path / "b.pte")
    cache = tmp_path / "cache"
    old = ptestore.ensure(first, cache_dir=cache, backends=[SPEC], device=DEVICE)
    lock = cache / "locks" / f"{old.key}.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(tmp_path / "elsewhere")
    new = ptestore.ensure(second, cache_dir=cache, backends=[SPEC], device=DEVICE, max_bytes=1)
    assert new.created and Path(new.pte).is_file() and Path(old.pte).is_file()
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"{cache / 'entries' / old.key}: not evicted: ")


DECLINING = "examples.bf16_round:Bf16Round"  # declines a .pte whose weights are in its .ptd
EXT = get_fixture("mlp_xnnpack_ext")


def _unchanged(src: Path, key: str, reason: str) -> tuple[str, str]:
    """The start and the end of the warning of an ``ensure`` run that specialized
    nothing (the installed backends between them depend on the environment)."""
    return (
        f"nothing was specialized in {src}: {reason}. Backend ids in the program: "
        "XnnpackBackend. Installed backends: ",
        "The .pte holds no named data of its own: if this program keeps its weights in a "
        ".ptd, pass it (CLI: --ptd PTD; Python: ptd=PATH). ensure serves the model "
        f"unchanged all the same (cache entry {key}, specialized: false).",
    )


def test_a_run_that_specializes_nothing_is_served_but_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/concepts.md, "No silent no-op": ensure keeps serving the unchanged model (a
    device app wants one) but no longer silently: a warning says nothing was specialized
    and why, with specialize's hint in ensure's words (the .ptd forgotten here), and a
    hit on that entry says it is served unchanged. It was exit 0 and silent."""
    src = tmp_path / "ext.pte"
    src.write_bytes(EXT.pte_path.read_bytes())
    caplog.set_level("WARNING", logger="ptestore.device")
    a = ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[DECLINING])
    assert a.created and not a.specialized
    said = [r.getMessage() for r in caplog.records if r.name == "ptestore.device"]
    assert len(said) == 1, said
    head, tail = _unchanged(
        src,
        a.key,
        f"every backend declined ('XnnpackBackend': {DECLINING} declined: no plain float32 "
        "weights in this model)",
    )
    assert said[0].startswith(head) and said[0].endswith(tail), said[0]
    caplog.clear()
    again = ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[DECLINING])
    assert not again.created and not again.specialized and again.pte == a.pte
    assert [r.getMessage() for r in caplog.records if r.name == "ptestore.device"] == [
        f"{src}: served unchanged from the cache (entry {a.key}, specialized: false): "
        "nothing was specialized when it was made (its warning said why)"
    ]
    # With the .ptd it specializes, and says nothing.
    caplog.clear()
    made = ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[DECLINING], ptd=EXT.ptd_path)
    assert made.created and made.specialized
    assert [r for r in caplog.records if r.name == "ptestore.device"] == []


def test_in_place_that_specializes_nothing_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = tmp_path / "ext.pte"
    src.write_bytes(EXT.pte_path.read_bytes())
    caplog.set_level("WARNING", logger="ptestore.device")
    a = ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[DECLINING], in_place=True)
    assert a.created and a.in_place and not a.specialized
    said = [r.getMessage() for r in caplog.records if r.name == "ptestore.device"]
    assert len(said) == 1 and said[0].endswith(_unchanged(src, a.key, "")[1]), said


def test_the_cli_says_on_stderr_that_nothing_was_specialized(tmp_path: Path) -> None:
    """``ptestore ensure`` of a model whose .ptd was forgotten: exit 0 and the path (the
    model is served), and a line on stderr saying why nothing was specialized, the hint
    in ensure's flags (``specialize`` exits 2 with the same reason), in the command
    line's form (``ptestore ensure: warning: ``; logging's handler printed it bare);
    with ``-v`` once, as the record the CLI's handler prints (not also as a line)."""
    src = tmp_path / "ext.pte"
    src.write_bytes(EXT.pte_path.read_bytes())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]))
    argv = [sys.executable, "-m", "ptestore", "ensure", str(src), "--cache-dir"]
    argv += [str(tmp_path / "c"), "--backend", DECLINING, "--no-progress"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    pte = done.stdout.strip()
    key = Path(pte).parent.name
    head, tail = _unchanged(
        src,
        key,
        f"every backend declined ('XnnpackBackend': {DECLINING} declined: no plain float32 "
        "weights in this model)",
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ptestore ensure: warning: {head}"), lines
    assert lines[0].endswith(tail), lines
    again = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert (again.returncode, again.stdout.strip()) == (0, pte)
    hit = (
        f"ptestore ensure: warning: {src}: served unchanged from the cache (entry {key}, "
        "specialized: false): nothing was specialized when it was made (its warning said why)"
    )
    assert again.stderr == f"{hit}\n"
    loud = subprocess.run([*argv, "-v"], env=env, capture_output=True, text=True, check=False)
    assert loud.returncode == 0
    record = hit.replace("ptestore ensure: warning: ", "ptestore.device: WARNING: ")
    assert [s for s in loud.stderr.splitlines() if "served unchanged" in s] == [record]


#: A backend that reads a weight of the .ptd: without the .ptd, its run fails.
READS_PTD = "support.doubling_backend:Doubling=mlp_xnnpack_ext"


def test_a_failed_make_leaves_no_entry_directory(tmp_path: Path) -> None:
    """A run that fails (a backend error here) removes the entry directory it created,
    which ``cache ls`` listed as an incomplete entry; an entry directory that was there
    before the run is left as it was."""
    src = tmp_path / "ext.pte"
    src.write_bytes(EXT.pte_path.read_bytes())
    cache = tmp_path / "cache"
    with pytest.raises(BackendError):
        ptestore.ensure(src, cache_dir=cache, backends=[READS_PTD])
    assert list_entries(cache) == [] and os.listdir(cache / "entries") == []
    key = entry_key(str(src), None, [READS_PTD], None, False, True)
    (cache / "entries" / key).mkdir()  # there before the run: not the run's to remove
    with pytest.raises(BackendError):
        ptestore.ensure(src, cache_dir=cache, backends=[READS_PTD])
    assert [(e.key, e.state) for e in list_entries(cache)] == [(key, "incomplete")]


def test_a_key_of_the_missing_ptd_is_hinted_in_ensure_s_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend reads a weight of the .ptd that was not given: the MissingNamedData it
    gets (and the BackendError quoting it) tells how to pass the .ptd to ``ensure``, not
    to ``specialize`` (it said ``--ptd SRC_PTD DST_PTD``, which ensure refuses), in
    Python and in the CLI, as a copy and in place."""
    from ptestore.cli import main
    from ptestore.errors import MissingNamedData

    src = tmp_path / "ext.pte"
    src.write_bytes(EXT.pte_path.read_bytes())
    assert EXT.doubled is not None
    key = EXT.doubled.key
    missing = (
        f"named data key {key!r} is not in {src}: no .ptd was given, and a key the .pte "
        "does not hold is in the model's .ptd (its external weights): pass it (CLI: --ptd "
        "PTD; Python: ptd=PATH)"
    )
    said = (
        f"backend 'XnnpackBackend' ({READS_PTD}), key {key!r}: initialize_backend_data "
        f"failed: MissingNamedData: {missing}"
    )
    for in_place in (False, True):
        with pytest.raises(BackendError) as info:
            ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[READS_PTD], in_place=in_place)
        assert str(info.value) == said
        cause = info.value.__cause__
        assert isinstance(cause, MissingNamedData) and str(cause) == missing
    argv = ["ensure", str(src), "--cache-dir", str(tmp_path / "c"), "--backend", READS_PTD]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ptestore ensure: failed, nothing published: {said}\n"), err


class CatchesMissing(BackendInterface):
    """Reads a key of the .ptd, catches the ``MissingNamedData`` (on its own thread
    too) and declines: it keeps what the error said when the backend got it."""

    name = "XnnpackBackend"
    version = "1.0"

    def __init__(self, key: str) -> None:
        self.key = key
        self.said: list[str] = []

    def _read(self, context: Any) -> None:
        from ptestore.errors import MissingNamedData

        try:
            context.get_named_data_map().get_data(self.key)
        except MissingNamedData as exc:
            self.said.append(str(exc))

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        import threading

        self._read(context)
        worker = threading.Thread(target=self._read, args=(context,))  # its own thread
        worker.start()
        worker.join()

    def __repr__(self) -> str:
        return "CatchesMissing()"


def test_a_backend_catching_missing_named_data_sees_ensure_s_flags(tmp_path: Path) -> None:
    """The hint is made in ensure's words when the error is raised (the run carries
    them): a backend that catches the ``MissingNamedData`` itself, on the run's thread
    or its own, read ``specialize``'s (``--ptd SRC_PTD DST_PTD``) while ensure rewrote
    only the error that left the run. ``specialize`` keeps its own words."""
    from ptestore.coordinator.report import current_ptd_spelling, ptd_spelling

    src = tmp_path / "ext.pte"
    src.write_bytes(EXT.pte_path.read_bytes())
    assert EXT.doubled is not None
    key = EXT.doubled.key
    head = (
        f"named data key {key!r} is not in {src}: no .ptd was given, and a key the .pte "
        "does not hold is in the model's .ptd (its external weights): "
    )
    for in_place in (False, True):
        backend = CatchesMissing(key)
        a = ptestore.ensure(src, cache_dir=tmp_path / "c", backends=[backend], in_place=in_place)
        assert not a.specialized  # it declined
        assert backend.said == [head + "pass it (CLI: --ptd PTD; Python: ptd=PATH)"] * 2
    backend = CatchesMissing(key)
    dst = tmp_path / "out.pte"
    ptestore.specialize(src, dst, backends=[backend], allow_unchanged=True)
    said = head + "pass it (CLI: --ptd SRC_PTD DST_PTD; Python: ptd=(src, dst))"
    assert backend.said == [said] * 2
    # the words are the context's: a run another thread makes meanwhile keeps its own
    import threading

    other: list[tuple[str, str]] = []
    with ptd_spelling(("--x", "x=")):
        worker = threading.Thread(target=lambda: other.append(current_ptd_spelling()))
        worker.start()
        worker.join()
        assert current_ptd_spelling() == ("--x", "x=")
    assert other == [("--ptd SRC_PTD DST_PTD", "ptd=(src, dst)")]
    assert current_ptd_spelling() == other[0]
