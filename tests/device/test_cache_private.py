"""The cache is this user's alone (issue 29 F), and a hit is never served from a file
changed behind the cache's back, even at the same size with its mtime set back (16).

As root, other owners are real: the tests chown paths to another uid and chmod them
group or world writable, then call ``ensure`` as an app would."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from support.fixtures import get_fixture
from support.forged import content_of

import ptestore
from ptestore.cli import main
from ptestore.errors import PermissionDenied

FIX = get_fixture("mlp_xnnpack")
SPEC = "support.fleet_backend:Scaler=1.0"
OTHER = 4242  # a uid no test process runs as


def _ensure(cache: Path) -> ptestore.Artifact:
    assert FIX.pte_path is not None
    return ptestore.ensure(FIX.pte_path, cache_dir=cache, backends=[SPEC])


def _me() -> str:
    import pwd

    uid = os.geteuid()
    return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"


def _refusal(path: Path, what: str, problem: str, fix: str) -> str:
    return (
        f"{path}: the {what} {problem}: another user could plant, change or remove what "
        "ensure serves from it; ptestore uses only a cache that is this user's alone. "
        f"Fix: {fix} (or use another --cache-dir)"
    )


@pytest.mark.parametrize(
    ("where", "what"),
    [
        ("", "cache directory"),
        ("entries", "cache directory's"),
        ("locks", "cache directory's"),
        ("entry", "cache entry"),
        ("manifest", "cache entry's manifest"),
    ],
)
@pytest.mark.parametrize("how", ["g+w", "o+w", "chown"])
def test_a_cache_path_others_can_write_is_refused(
    tmp_path: Path, where: str, what: str, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    made = _ensure(cache)
    path = {
        "entry": cache / "entries" / made.key,
        "manifest": cache / "entries" / made.key / "manifest.json",
    }.get(where, cache / where)
    mode = stat.S_IMODE(path.stat().st_mode)
    if how == "chown":
        os.chown(path, OTHER, -1)
        problem = f"is owned by uid {OTHER}, not by this user ({_me()})"
        fix = f"chown {os.geteuid()} {path}"
    else:
        mode |= stat.S_IWGRP if how == "g+w" else stat.S_IWOTH
        os.chmod(path, mode)
        who = "group" if how == "g+w" else "others"
        problem = f"is writable by {who} (mode {mode:04o})"
        fix = f"chmod go-w {path}"
    with pytest.raises(PermissionDenied) as info:
        _ensure(cache)
    assert str(info.value) == _refusal(path, what, problem, fix)
    argv = ["ensure", str(FIX.pte_path), "--cache-dir", str(cache), "--backend", SPEC]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"ptestore ensure: error: {info.value}\n"
    # Fixed as the message says, the entry is a hit again.
    if how == "chown":
        os.chown(path, os.geteuid(), -1)
    else:
        os.chmod(path, mode & ~(stat.S_IWGRP | stat.S_IWOTH))
    again = _ensure(cache)
    assert not again.created and again.pte == made.pte


@pytest.mark.parametrize("how", ["g+w", "chown"])
def test_an_entry_file_others_can_write_is_not_a_hit(tmp_path: Path, how: str) -> None:
    cache = tmp_path / "cache"
    made = _ensure(cache)
    pte = Path(made.pte)
    if how == "chown":
        os.chown(pte, OTHER, -1)
    else:
        os.chmod(pte, 0o664)
    again = _ensure(cache)
    assert again.created and again.pte == made.pte  # made again, the file is ours again
    st = os.stat(again.pte)
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
    assert not _ensure(cache).created


def test_under_umask_002_the_cache_is_made_private_and_hits(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        cache = tmp_path / "cache"
        made = _ensure(cache)
        assert made.created
        hit = _ensure(cache)
        assert not hit.created and hit.pte == made.pte
    finally:
        os.umask(old)
    entry = cache / "entries" / made.key
    for p in (cache, cache / "entries", cache / "locks", entry, *entry.iterdir()):
        assert not p.stat().st_mode & 0o022, p


def test_a_same_size_overwrite_with_its_mtime_set_back_is_not_a_hit(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    made = _ensure(cache)
    pte = Path(made.pte)
    good = pte.read_bytes()
    before = pte.stat()
    # Rewritten in place: the same size and inode, the modification time set back. The
    # change time comes from the kernel's coarse clock: a rewrite within the tick of the
    # file's last change keeps it too (then nothing in a stat tells the versions apart), so
    # the rewrite is done again until the tick has passed (a few ms; no sleep).
    while True:
        with open(pte, "r+b") as f:
            f.seek(len(good) // 2)
            f.write(bytes([good[len(good) // 2] ^ 0xFF]))
        os.utime(pte, ns=(before.st_atime_ns, before.st_mtime_ns))
        st = pte.stat()
        if st.st_ctime_ns != before.st_ctime_ns:
            break
    assert (st.st_size, st.st_ino, st.st_mtime_ns) == (
        before.st_size,
        before.st_ino,
        before.st_mtime_ns,
    )
    again = _ensure(cache)
    assert again.created  # not served: made again
    # the same model made again (its record's time, to the second, may differ)
    assert content_of(Path(again.pte).read_bytes()) == content_of(good)
    assert not _ensure(cache).created


@pytest.mark.parametrize("where", ["", "entries", "locks"])
def test_prune_and_clear_refuse_a_cache_others_can_write(tmp_path: Path, where: str) -> None:
    """``cache prune``/``clear`` (and an eviction) removed entries without the check
    ``ensure`` makes: a cache directory others can write to, or an ``entries`` link
    they planted, was followed by root's ``clear``. Refused before anything is removed."""
    from ptestore.device import clear, evict, prune

    cache = tmp_path / "cache"
    made = _ensure(cache)
    path = cache / where
    mode = stat.S_IMODE(path.stat().st_mode) | stat.S_IWOTH
    os.chmod(path, mode)
    want = _refusal(
        path,
        "cache directory" if not where else "cache directory's",
        f"is writable by others (mode {mode:04o})",
        f"chmod go-w {path}",
    )
    for call in (lambda: clear(cache), lambda: prune(cache), lambda: evict(cache, 0)):
        with pytest.raises(PermissionDenied) as info:
            call()
        assert str(info.value) == want
    assert Path(made.pte).is_file()
