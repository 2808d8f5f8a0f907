"""``fetch`` publishes its ``.part`` over ``DEST`` by the storage-wide rule
(docs/storage.md), as ``LocalFileWriter`` does: a file it replaces keeps its permission
bits, never setuid, setgid or sticky, and its owner and group as far as the process may
(as root both); a new destination gets ``0666`` less the umask, as before. The ``.part``
was made ``0666`` less the umask and renamed as it was: a ``0600`` model became
``0644``, readable by everyone, and root made a user's model its own. Whatever the
download takes (chunk by chunk, from a base, whole), and the ``.part`` is ``0600``
while the download is in it."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.as_user import NOBODY, ROOT_ONLY, as_user, give_tree, reachable_dir
from support.as_user import owner_and_mode as _owner
from support.fixtures import get_fixture
from support.fleet_backend import specialized_pair

import ptestore
from ptestore.errors import StorageError
from ptestore.fleet.fetch import FetchEvent, FetchResult

FX = get_fixture("mlp_portable")
DATA = Path(__file__).parents[1] / "provenance" / "data"
assert FX.pte_path is not None


@pytest.fixture
def artifact() -> Iterator[Path]:
    """A small artifact with a chunk record (what ``fetch`` checks chunk by chunk),
    readable by every user."""
    with reachable_dir("ptestore-fetch-modes-src-") as d:
        out = d / "art.pte"
        ptestore.specialize(FX.pte_path, out, backends=["passthrough"], allow_unchanged=True)
        yield out


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach."""
    with reachable_dir("ptestore-fetch-modes-") as d:
        yield d


def _old_file(path: Path, uid: int, bits: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"the previous version")
    os.chown(path, uid, uid)
    os.chmod(path, bits)  # after the chown, which clears setuid and setgid
    return path


def _verified(result: FetchResult) -> list[str]:
    return [str(f["verified"]) for f in result.files]


@ROOT_ONLY
@pytest.mark.parametrize("bits", [0o600, 0o4640, 0o1660], ids=["600", "4640", "1660"])
def test_root_fetching_over_a_users_model_keeps_its_owner_and_permission_bits(
    artifact: Path, tmp_path: Path, bits: int
) -> None:
    """Was ``root:root 0644`` whatever the file was."""
    dest = _old_file(tmp_path / "dev" / "m.pte", 1000, bits)
    result = ptestore.fetch(artifact, dest)
    assert _verified(result) == ["chunks"]
    assert dest.read_bytes() == artifact.read_bytes()
    assert _owner(dest) == (1000, 1000, bits & 0o777)


@ROOT_ONLY
def test_a_delta_fetch_keeps_the_replaced_files_owner_and_mode(
    artifact: Path, tmp_path: Path
) -> None:
    """The chunks taken from a base (here the file's own earlier copy) go into the same
    ``.part``, published the same way."""
    base = tmp_path / "base.pte"
    shutil.copyfile(artifact, base)
    dest = _old_file(tmp_path / "dev" / "m.pte", 1000, 0o640)
    result = ptestore.fetch(artifact, dest, base=base)
    assert result.from_base > 0 and dest.read_bytes() == artifact.read_bytes()
    assert _owner(dest) == (1000, 1000, 0o640)


@ROOT_ONLY
@pytest.mark.parametrize("record", ["v2", "v1"], ids=["chunks", "whole"])
def test_each_file_of_a_pair_keeps_the_mode_of_the_one_it_replaces(
    tmp_path: Path, record: str
) -> None:
    """The ``.pte`` and its ``.ptd``, each over a file of its own: checked chunk by
    chunk, and checked whole (version-1 records)."""
    if record == "v2":
        pte, ptd = specialized_pair(tmp_path, "a", 2.0)
    else:
        pte, ptd = tmp_path / "v1_trailer.pte", tmp_path / "v1_trailer.ptd"
        for f in (pte, ptd):
            shutil.copyfile(DATA / f.name, f)
    dest = _old_file(tmp_path / "dev" / "m.pte", 1000, 0o640)
    dest_ptd = _old_file(tmp_path / "dev" / "m.ptd", 1001, 0o2600)
    result = ptestore.fetch(pte, dest)
    assert _verified(result) == ["chunks" if record == "v2" else "whole"] * 2
    assert dest_ptd.read_bytes() == ptd.read_bytes()
    assert _owner(dest) == (1000, 1000, 0o640)
    assert _owner(dest_ptd) == (1001, 1001, 0o600)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_new_destination_gets_0666_less_the_umask_and_the_part_is_0600(
    artifact: Path, tmp_path: Path, umask: int
) -> None:
    """A new file as before; the ``.part`` holding the download is this user's alone
    meanwhile (it was ``0666`` less the umask: a ``0600`` model's bytes readable by
    everyone while they arrived)."""
    dest = tmp_path / "dev" / "m.pte"
    part_modes: set[int] = set()

    def seen(event: FetchEvent) -> None:
        part_modes.add(stat.S_IMODE(os.stat(event.path + ".part").st_mode))

    old = os.umask(umask)
    try:
        ptestore.fetch(artifact, dest, events=seen)
    finally:
        os.umask(old)
    assert part_modes == {0o600}
    assert _owner(dest) == (os.geteuid(), os.getegid(), 0o666 & ~umask)


@ROOT_ONLY
def test_a_user_fetching_over_its_own_0600_model_keeps_it_0600(
    artifact: Path, shared_dir: Path
) -> None:
    """Was ``0644`` (the ``.part``'s ``0666`` less the umask 022)."""
    dest = shared_dir / "dev" / "m.pte"
    dest.parent.mkdir()
    give_tree(shared_dir, NOBODY)
    _old_file(dest, NOBODY, 0o600)

    def fetch() -> str:
        os.umask(0o022)
        return ptestore.fetch(artifact, dest).files[0]["verified"]

    assert as_user(NOBODY, fetch) == "ok: chunks"
    assert dest.read_bytes() == artifact.read_bytes()
    assert _owner(dest) == (NOBODY, NOBODY, 0o600)


def test_a_destination_that_cannot_be_looked_at_publishes_nothing(
    artifact: Path, tmp_path: Path
) -> None:
    """A link loop at ``DEST``: what it replaces cannot be known, so nothing is
    published (the local writer's message); the checked ``.part`` is kept, and a fetch
    run once the loop is gone publishes it."""
    dest = tmp_path / "m.pte"
    dest.symlink_to("loop")
    (tmp_path / "loop").symlink_to("m.pte")
    with pytest.raises(StorageError) as err:
        ptestore.fetch(artifact, dest)
    assert str(err.value) == f"{dest}: cannot stat destination: Too many levels of symbolic links"
    assert dest.is_symlink() and Path(f"{dest}.part").is_file()
    dest.unlink()
    result = ptestore.fetch(artifact, dest)
    assert result.files[0]["received"] < artifact.stat().st_size  # resumed
    assert dest.read_bytes() == artifact.read_bytes()


def test_a_pair_whose_pte_destination_cannot_be_looked_at_publishes_neither(
    tmp_path: Path,
) -> None:
    """A link loop at the ``.pte``'s ``DEST`` of a pair: every file is taken over before
    the first is renamed, so the ``.ptd`` is not published either (it was: "failed after
    a partial publish: m.ptd was published, m.pte was not")."""
    pte, ptd = specialized_pair(tmp_path, "a", 2.0)
    dev = tmp_path / "dev"
    dev.mkdir()
    dest = dev / "m.pte"
    dest.symlink_to("loop")
    (dev / "loop").symlink_to("m.pte")
    with pytest.raises(StorageError) as err:
        ptestore.fetch(pte, dest)
    assert str(err.value) == f"{dest}: cannot stat destination: Too many levels of symbolic links"
    assert not (dev / "m.ptd").exists() and dest.is_symlink()
    dest.unlink()
    ptestore.fetch(pte, dest)
    assert (
        dest.read_bytes() == pte.read_bytes() and (dev / "m.ptd").read_bytes() == ptd.read_bytes()
    )
