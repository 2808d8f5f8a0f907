"""The artifact hashed is the artifact run (``ptestore/xnnpack/pinned.py``), with the real
runtime.

``make_cache`` and ``load()`` open the ``.pte`` and ``.ptd`` once, hash those inodes and
hand the runtime the same ones (``/proc/self/fd/N``). Before, both hashed by path and
the runtime opened the path again seconds later: a ``.ptd`` with the same keys renamed
over it meanwhile was packed, or loaded, under the first one's digests. Each race is set
up by a hook at the exact step (the first child's start, the bindings' import), never by
waiting.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.xnnpack_probe import REPO, env, fresh_load, rewrite_weights

from ptestore.errors import ConfigurationError, IntegrityError, PackedWeightsRefused
from ptestore.testing.runtime import runtime_unavailable
from ptestore.xnnpack import CacheFile, find_cache, make_cache, verify_cache
from ptestore.xnnpack.runs import ChildRun

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(runtime_unavailable() is not None, reason=str(runtime_unavailable())),
]

FIXTURES = REPO / "tests" / "fixtures"
EXT_PTE, EXT_PTD = FIXTURES / "mlp_xnnpack_ext.pte", FIXTURES / "mlp_xnnpack_ext.ptd"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def artifact(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A writable copy of the external-weights MLP (``m.pte``, ``m.ptd``), a copy of its
    ``.ptd`` kept aside (``a.ptd``) and another ``.ptd`` with the same keys and other
    weights (``b.ptd``)."""
    pte, ptd = tmp_path / "m.pte", tmp_path / "m.ptd"
    shutil.copyfile(EXT_PTE, pte)
    shutil.copyfile(EXT_PTD, ptd)
    kept, other = tmp_path / "a.ptd", tmp_path / "b.ptd"
    shutil.copyfile(EXT_PTD, kept)
    rewrite_weights(EXT_PTD, other, pte=EXT_PTE)
    assert sha256(other) != sha256(kept) and other.stat().st_size == kept.stat().st_size
    return pte, ptd, kept, other


def at_first_child(monkeypatch: pytest.MonkeyPatch, action: object) -> None:
    """``action()`` just before the maker starts its first child (after the digests)."""
    real = ChildRun.run
    done: list[bool] = []

    def hooked(self: ChildRun, *args: object, **kwargs: object) -> None:
        if not done:
            done.append(True)
            action()  # type: ignore[operator]
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ChildRun, "run", hooked)


def test_a_ptd_renamed_over_while_made_is_not_what_gets_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pte, ptd, kept, other = artifact(tmp_path)
    at_first_child(monkeypatch, lambda: os.replace(other, ptd))
    made = make_cache(pte, ptd=ptd, directory=tmp_path / "cache")
    assert made.made and made.identity.ptd_sha256 == sha256(kept)
    # the file holds the packed weights of the .ptd its identity names: loaded with that
    # .ptd, the outputs are those of a load without the file, bit for bit
    assert verify_cache(made.path, pte=pte, ptd=kept).sha256 == made.sha256
    report, _ = fresh_load(pte, made.path, ptd=kept)
    assert report["same_bytes"] and report["loads_with_options"] == 1


def test_a_ptd_written_in_place_while_made_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pte, ptd, kept, other = artifact(tmp_path)
    at_first_child(monkeypatch, lambda: ptd.write_bytes(other.read_bytes()))
    directory = tmp_path / "cache"
    with pytest.raises(IntegrityError) as err:
        make_cache(pte, ptd=ptd, directory=directory)
    assert str(err.value) == (
        f"{ptd}: changed while its packed-weight file was made (SHA-256 {sha256(other)} != "
        f"{sha256(kept)}, the digest it was made for); nothing published"
    )
    assert find_cache(pte, ptd=kept, directory=directory) is None
    assert [p.suffix for p in directory.iterdir()] == [".lock"]  # no file, no refusal


def test_an_artifact_cut_short_while_made_is_no_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``.pte`` truncated in place just before the first child: the real child fails
    on the bytes it now reads, a failure of the artifact as it was meanwhile, never of
    the artifact the file is for. ``IntegrityError``, nothing published and nothing
    remembered: the same bytes written back make the file."""
    pte = tmp_path / "m.pte"
    shutil.copyfile(FIXTURES / "mlp_xnnpack.pte", pte)
    kept = pte.read_bytes()
    at_first_child(monkeypatch, lambda: os.truncate(pte, 0))
    directory = tmp_path / "cache"
    with pytest.raises(IntegrityError) as err:
        make_cache(pte, directory=directory)
    assert str(err.value) == (
        f"{pte}: changed while its packed-weight file was made (SHA-256 "
        f"{hashlib.sha256(b'').hexdigest()} != {hashlib.sha256(kept).hexdigest()}, the "
        "digest it was made for); nothing published"
    )
    assert isinstance(err.value.__cause__, PackedWeightsRefused)  # what the child did
    assert [p.suffix for p in directory.iterdir()] == [".lock"]  # no file, no refusal
    pte.write_bytes(kept)
    made = make_cache(pte, directory=directory)
    assert made.made and made.entries == 2


LOAD = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import ptestore.xnnpack.loader as loader
    from ptestore.xnnpack import load
    pte, ptd, cache, role, other = sys.argv[1:]
    target = pte if role == "pte" else ptd
    real = loader.bindings
    def renamed_over():  # after the check, before the runtime opens the artifact
        os.replace(other, target)
        return real()
    loader.bindings = renamed_over
    program = load(pte, ptd=ptd, cache=cache)
    now = os.stat(target)
    opened = []  # this process's descriptors of the file now at the path
    for n in os.listdir("/proc/self/fd"):
        try:
            st = os.stat(f"/proc/self/fd/{n}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
            opened.append(n)
    x = np.random.default_rng(0).standard_normal((2, 16), dtype=np.float32)
    try:
        program.run("forward", [x])
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"opened": len(opened), "error": error}))
    """
)


@pytest.fixture(scope="module")
def ext_made(tmp_path_factory: pytest.TempPathFactory) -> CacheFile:
    return make_cache(EXT_PTE, ptd=EXT_PTD, directory=tmp_path_factory.mktemp("made"))


@pytest.mark.parametrize("role", ["pte", "ptd"])
def test_load_hands_the_runtime_the_artifact_it_checked(
    ext_made: CacheFile, tmp_path: Path, role: str
) -> None:
    pte, ptd, _, other = artifact(tmp_path)
    if role == "pte":  # the same bytes in another inode: still not the file checked
        other = tmp_path / "b.pte"
        shutil.copyfile(pte, other)
    out = subprocess.run(
        [sys.executable, "-c", LOAD, str(pte), str(ptd), str(ext_made.path), role, str(other)],
        capture_output=True,
        text=True,
        env=env(),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["opened"] == 0  # the runtime opened the inode checked, not the new one
    target = pte if role == "pte" else ptd
    assert report["error"] == (
        f"IntegrityError: {target}: removed, replaced or changed since load() verified it; "
        "method 'forward' not loaded (load it again)"
    )


def test_an_artifact_that_is_a_fifo_is_refused_without_blocking(
    ext_made: CacheFile, tmp_path: Path
) -> None:
    fifo = tmp_path / "m.ptd"
    os.mkfifo(fifo)
    with pytest.raises(ConfigurationError) as err:
        verify_cache(ext_made.path, pte=EXT_PTE, ptd=fifo)
    assert str(err.value) == (
        f"{fifo}: is a FIFO (named pipe), not a regular file; refusing to read it"
    )
