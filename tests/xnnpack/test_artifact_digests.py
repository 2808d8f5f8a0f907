"""The artifact's digests a packed-weight file is bound to are hashed once per version of
the artifact's files, not at every check: the record remembers them by path and stamp
(``ptestore/xnnpack/digests.py``), and a quick check (``full=False``) takes them from
there while the ``.pte`` and ``.ptd`` are unchanged. Files made by the real runtime; each
test counts the artifact hashes by spying on the one function that computes them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from support.xnnpack_probe import REPO

import ptestore.xnnpack.digests as digests_module
from ptestore.errors import IntegrityError
from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack import CacheFile, find_cache, make_cache, verify_cache
from ptestore.xnnpack.digests import ENDS
from ptestore.xnnpack.record import stamp

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

FIXTURES = REPO / "tests" / "fixtures"


def _settled() -> int:
    """The clock as if every check ran 10 s after the files it hashes were written (a
    file changed within a clock tick of its hashing is not remembered: see the racy
    test below, which runs on the real clock)."""
    return time.time_ns() + 10_000_000_000


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> CacheFile:
    """A file made for a copy of the fixture (its stamps are the test's to change)."""
    directory = tmp_path_factory.mktemp("digests")
    pte = directory / "model.pte"
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", pte)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(digests_module, "now_ns", _settled)
        return make_cache(pte, directory=directory)


@pytest.fixture(autouse=True)
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digests_module, "now_ns", _settled)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The artifact files hashed from now on (their paths: the file a descriptor held
    open names, for ``/proc/self/fd/N``)."""
    seen: list[str] = []
    real = digests_module.file_sha256

    def counting(path: Any) -> str:
        name = os.fspath(path)
        seen.append(os.readlink(name) if name.startswith("/proc/self/fd/") else name)
        return real(path)

    monkeypatch.setattr(digests_module, "file_sha256", counting)
    return seen


def _setup(made: CacheFile, tmp_path: Path) -> tuple[Path, Path]:
    """A directory holding ``made``'s file, its record and a copy of its artifact, the
    record as ``make_cache`` wrote it but for the artifact's new path."""
    pte = tmp_path / "model.pte"
    shutil.copy2(made.path.parent / "model.pte", pte)
    for p in (made.path, made.record_path):
        shutil.copy2(p, tmp_path / p.name)
    return pte, tmp_path / made.path.name


def _memo(record_path: Path) -> dict[str, Any]:
    memo: dict[str, Any] = json.loads(record_path.read_text())["artifacts"]
    return memo


def _ends(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha256(data[:ENDS] + data[max(ENDS, len(data) - ENDS) :]).hexdigest()


def test_making_remembers_the_digest_it_hashed(made: CacheFile) -> None:
    pte = made.path.parent / "model.pte"
    assert _memo(made.record_path) == {
        str(pte): {
            "sha256": made.identity.pte_sha256,
            "stamp": stamp(pte.stat()),
            "ends": _ends(pte),
        }
    }


def test_a_file_changed_just_before_its_hashing_is_remembered_only_later(
    made: CacheFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[str]
) -> None:
    pte, packed = _setup(made, tmp_path)
    record_path = packed.with_name(packed.name + ".json")
    changed = max(pte.stat().st_mtime_ns, pte.stat().st_ctime_ns)
    monkeypatch.setattr(digests_module, "now_ns", lambda: changed + 50_000_000)  # 50 ms on
    assert verify_cache(packed, pte=pte, full=False).path == packed
    assert str(pte) not in _memo(record_path)  # a change in the same tick could hide
    monkeypatch.setattr(digests_module, "now_ns", lambda: changed + 150_000_000)
    assert verify_cache(packed, pte=pte, full=False).path == packed
    assert str(pte) in _memo(record_path)
    assert verify_cache(packed, pte=pte, full=False).path == packed
    assert hashed == [str(pte)] * 2
    # whole-second times (a file system that keeps no more): 2 s, not 100 ms
    assert digests_module._racy(
        {"mtime_ns": 7_000_000_000, "ctime_ns": 7_000_000_000}, 8_500_000_000
    )
    assert not digests_module._racy(
        {"mtime_ns": 7_000_000_000, "ctime_ns": 7_000_000_001}, 7_200_000_001
    )


def test_a_remembered_digest_needs_the_same_ends_and_a_well_formed_digest(
    made: CacheFile, tmp_path: Path, hashed: list[str]
) -> None:
    """Times set to fixed values (a reproducible image) keep a stamp; the ends differ."""
    pte, packed = _setup(made, tmp_path)
    record_path = packed.with_name(packed.name + ".json")
    assert verify_cache(packed, pte=pte, full=False).path == packed
    for bad in ({"ends": "0" * 64}, {"sha256": "zz"}, {"sha256": ""}):
        record = json.loads(record_path.read_text())
        record["artifacts"][str(pte)].update(bad)
        os.chmod(record_path, 0o644)
        record_path.write_text(json.dumps(record))
        os.chmod(record_path, 0o444)
        # not used: hashed again (and then remembered right)
        assert verify_cache(packed, pte=pte, full=False).path == packed
        assert _memo(record_path)[str(pte)]["sha256"] == made.identity.pte_sha256
    assert hashed == [str(pte)] * 4


def test_quick_checks_hash_the_artifact_once_per_version(
    made: CacheFile, tmp_path: Path, hashed: list[str]
) -> None:
    pte, packed = _setup(made, tmp_path)
    record_path = packed.with_name(packed.name + ".json")
    # this path is not remembered yet: hashed once, then remembered beside the other
    assert verify_cache(packed, pte=pte, full=False).sha256 == made.sha256
    assert hashed == [str(pte)]
    assert _memo(record_path)[str(pte)] == {
        "sha256": made.identity.pte_sha256,
        "stamp": stamp(pte.stat()),
        "ends": _ends(pte),
    }
    # from now on no quick check hashes it: verify (what load() calls), find, make
    assert verify_cache(packed, pte=pte, full=False).path == packed
    found = find_cache(pte, directory=tmp_path, full=False)
    assert found is not None and found.path == packed
    again = make_cache(pte, directory=tmp_path, full=False)
    assert (again.made, again.path) == (False, packed)
    assert hashed == [str(pte)]
    # a full check hashes everything, every time
    verify_cache(packed, pte=pte)
    assert find_cache(pte, directory=tmp_path) is not None
    assert hashed == [str(pte)] * 3
    # the artifact touched (same bytes, another mtime): hashed again, once
    os.utime(pte, ns=(1_000_000_000, 1_000_000_000))
    assert verify_cache(packed, pte=pte, full=False).path == packed
    assert verify_cache(packed, pte=pte, full=False).path == packed
    assert hashed == [str(pte)] * 4
    assert _memo(record_path)[str(pte)]["stamp"] == stamp(pte.stat())


def test_an_artifact_changed_in_place_is_never_taken_for_the_remembered_one(
    made: CacheFile, tmp_path: Path, hashed: list[str]
) -> None:
    pte, packed = _setup(made, tmp_path)
    assert verify_cache(packed, pte=pte, full=False).path == packed
    # same size, same path, same inode, other bytes, the mtime even set back: the ctime
    # moved, so the remembered digest is not used
    before = pte.stat()
    with open(pte, "r+b") as f:
        f.seek(before.st_size // 2)
        byte = f.read(1)
        f.seek(before.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(pte, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert pte.stat().st_ino == before.st_ino and pte.stat().st_size == before.st_size
    with pytest.raises(IntegrityError) as err:
        verify_cache(packed, pte=pte, full=False)
    assert str(err.value).startswith(
        f"{packed}: made for another artifact, runtime or CPU (pte_sha256: "
    )
    assert find_cache(pte, directory=tmp_path, full=False) is None
    assert hashed == [str(pte)] * 3
    # nothing about the changed file was remembered: the record still names the old one
    assert _memo(packed.with_name(packed.name + ".json"))[str(pte)]["stamp"] != stamp(pte.stat())


def test_a_given_digest_or_one_hashed_while_the_file_changed_is_not_remembered(
    made: CacheFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pte, packed = _setup(made, tmp_path)
    record_path = packed.with_name(packed.name + ".json")
    verify_cache(packed, pte=pte, pte_sha256=made.identity.pte_sha256, full=False)
    assert str(pte) not in _memo(record_path)  # the caller's word, not remembered
    real = digests_module.file_sha256

    def touching(path: Any) -> str:
        digest = real(path)
        os.utime(path, ns=(5_000_000_000, 5_000_000_000))  # the file changed meanwhile
        return digest

    monkeypatch.setattr(digests_module, "file_sha256", touching)
    assert verify_cache(packed, pte=pte, full=False).path == packed
    assert str(pte) not in _memo(record_path)


def test_a_directory_it_cannot_write_still_checks(
    made: CacheFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hashed: list[str]
) -> None:
    pte, packed = _setup(made, tmp_path)

    def refused(data: bytes, target: Path) -> None:
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(digests_module, "publish_read_only", refused)
    for _ in range(2):  # nothing remembered: hashed each time, never failing for it
        assert verify_cache(packed, pte=pte, full=False).path == packed
    assert hashed == [str(pte)] * 2


def test_with_a_ptd_both_are_remembered(tmp_path: Path, hashed: list[str]) -> None:
    pte, ptd = tmp_path / "m.pte", tmp_path / "m.ptd"
    shutil.copyfile(FIXTURES / "mlp_xnnpack_ext.pte", pte)
    shutil.copyfile(FIXTURES / "mlp_xnnpack_ext.ptd", ptd)
    made = make_cache(pte, ptd=ptd, directory=tmp_path)
    assert set(_memo(made.record_path)) == {str(pte), str(ptd)}
    assert sorted(hashed) == sorted([str(pte), str(ptd)])
    found = find_cache(pte, ptd=ptd, directory=tmp_path, full=False)
    assert found is not None and found.path == made.path
    assert len(hashed) == 2
    # the .ptd replaced by a copy of itself (another inode): only it is hashed again
    copy = tmp_path / "copy.ptd"
    shutil.copyfile(ptd, copy)
    os.replace(copy, ptd)
    assert verify_cache(made.path, pte=pte, ptd=ptd, full=False).path == made.path
    assert hashed[2:] == [str(ptd)]
    # without its .ptd the same .pte is another artifact, remembered or not
    with pytest.raises(IntegrityError, match="ptd_sha256: "):
        verify_cache(made.path, pte=pte, full=False)


def test_a_given_digest_is_checked_before_a_file_is_made_for_it(tmp_path: Path) -> None:
    """``make_cache(..., pte_sha256=D)`` (``ensure`` gives its entry's digest): a file
    replaced between the caller's hashing and the maker's open is not packed under D;
    nothing is made. A found file is served under the digest as before (its check at
    load compares the artifact)."""
    pte = tmp_path / "model.pte"
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", pte)
    real = hashlib.sha256(pte.read_bytes()).hexdigest()
    wrong = "0" * 64
    with pytest.raises(IntegrityError) as info:
        make_cache(pte, directory=tmp_path / "c", pte_sha256=wrong)
    assert str(info.value) == (
        f"{pte}: its SHA-256 is {real}, not {wrong}, the digest the packed-weight file was "
        "asked for (replaced since it was hashed?); nothing made"
    )
    assert [p.name for p in (tmp_path / "c").iterdir() if p.suffix == ".xpwc"] == []
