"""``ensure(in_place=True, portable=...)``: the staged copy renamed over the model keeps
what the storage-wide rule keeps of a replaced file (docs/storage.md), as
``LocalFileWriter`` does: its permission bits, never setuid, setgid or sticky, and its
owner and group as far as the process may (as root both). It kept the whole mode,
setuid and setgid included, and took the running process's owner: root made a user's
model a root-owned setuid file its owner could no longer write."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.as_user import NOBODY, ROOT_ONLY, as_user, give_tree, reachable_dir
from support.as_user import owner_and_mode as _owner
from support.fixtures import get_fixture

import ptestore

FX = get_fixture("mlp_portable")
assert FX.pte_path is not None


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach."""
    with reachable_dir("ptestore-inplace-modes-") as d:
        yield d


def _model(directory: Path, name: str, uid: int, bits: int) -> Path:
    path = directory / name
    shutil.copyfile(FX.pte_path, path)  # type: ignore[arg-type]
    os.chown(path, uid, uid)
    os.chmod(path, bits)
    return path


def _ensure(src: Path, cache: Path, portable: Path) -> str:
    made = ptestore.ensure(
        src, cache_dir=cache, backends=["passthrough"], in_place=True, portable=portable
    )
    return made.pte


@ROOT_ONLY
@pytest.mark.parametrize("bits", [0o6750, 0o1640, 0o600], ids=["6750", "1640", "600"])
def test_root_rewriting_a_users_model_keeps_its_owner_and_permission_bits(
    shared_dir: Path, bits: int
) -> None:
    """Root rewrites a user's model from its portable source: the model stays the
    user's (uid and gid), with its permission bits and without setuid, setgid or
    sticky (was ``root:root`` with the whole mode: ``-rwsr-s---`` for a ``6750``
    file); the same as a plain ``specialize`` over the same kind of file."""
    src = _model(shared_dir, "m.pte", 1000, bits)
    portable = _model(shared_dir, "portable.pte", 0, 0o644)
    assert _ensure(src, shared_dir / "cache", portable) == str(src)
    assert _owner(src) == (1000, 1000, bits & 0o777)
    assert ptestore.verify(src).status == "intact"
    staged = _model(shared_dir, "staged.pte", 1000, bits)
    ptestore.specialize(portable, staged, backends=["passthrough"], allow_unchanged=True)
    assert _owner(staged) == _owner(src)
    # a hit afterwards: the manifest recorded the file as it is now, owner included
    assert not ptestore.ensure(
        src, cache_dir=shared_dir / "cache", backends=["passthrough"], in_place=True
    ).created


@ROOT_ONLY
def test_a_user_rewriting_its_own_setgid_model_drops_the_bit(shared_dir: Path) -> None:
    """A user's own ``2750`` model, rewritten by that user: ``0750``, its own ids (the
    setgid bit was kept)."""
    src = _model(shared_dir, "m.pte", NOBODY, 0o750)
    portable = _model(shared_dir, "portable.pte", NOBODY, 0o644)
    give_tree(shared_dir, NOBODY)
    src.chmod(0o2750)  # after the chown, which clears it
    assert _owner(src) == (NOBODY, NOBODY, 0o2750)
    got = as_user(NOBODY, lambda: _ensure(src, shared_dir / "cache", portable))
    assert got == f"ok: {src}"
    assert _owner(src) == (NOBODY, NOBODY, 0o750)
