"""FsspecWriter: an unchanged whole object on the same filesystem is copied by the
filesystem (``fs.copy``); anything else is read and uploaded."""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from support.fixtures import get_fixture

import ptestore
from ptestore.errors import AlreadyExists, PublishUncertain, StorageError
from ptestore.storage.loaders import BytesLoader, FsspecLoader
from ptestore.writers import FsspecWriter, WriterState

N = 50_000
GAP = (1000, 1100)  # zeros in the source, written as zeros (like padding)


class Spy:
    def __init__(self, fs: Any, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        original = fs.copy

        def copy(path1: str, path2: str, **kw: Any) -> Any:
            self.calls.append((path1, path2))
            if fail:
                raise NotImplementedError("no copy here")
            return original(path1, path2, **kw)

        monkeypatch.setattr(fs, "copy", copy)


@pytest.fixture
def fs() -> Any:
    return fsspec.filesystem("memory")


@pytest.fixture
def root() -> str:
    return f"/gen-{uuid.uuid4().hex}"


def source(fs: Any, root: str) -> tuple[bytes, FsspecLoader]:
    data = bytearray(random.randbytes(N))
    data[GAP[0] : GAP[1]] = bytes(GAP[1] - GAP[0])
    fs.pipe(f"{root}/src.pte", bytes(data))
    return bytes(data), FsspecLoader(fs, f"{root}/src.pte", f"memory://{root}/src.pte")


def like_the_coordinator(w: FsspecWriter, loader: Any, meta: bytes) -> None:
    w.write(bytes(GAP[1] - GAP[0]), GAP[0])
    w.copy_from(loader, 200, GAP[0] - 200, 200)
    w.copy_from(loader, GAP[1], N - GAP[1], GAP[1])
    w.write(meta, 0)


def test_unchanged_whole_object_is_copied_by_the_filesystem(
    fs: Any, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, loader = source(fs, root)
    spy = Spy(fs, monkeypatch)
    w = FsspecWriter(f"memory://{root}/dst.pte", fs=fs)
    like_the_coordinator(w, loader, data[:200])  # the metadata is the source's own
    result = w.publish()
    assert w.copied_whole and spy.calls == [(f"{root}/src.pte", f"{root}/dst.pte")]
    assert fs.cat_file(f"{root}/dst.pte") == data
    assert result.size == N


@pytest.mark.parametrize("why", ["changed-bytes", "other-loader", "no-fs-copy"])
def test_everything_else_is_read_and_uploaded(
    fs: Any, root: str, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    data, loader = source(fs, root)
    spy = Spy(fs, monkeypatch, fail=why == "no-fs-copy")
    w = FsspecWriter(f"memory://{root}/dst.pte", fs=fs)
    meta = random.randbytes(200) if why == "changed-bytes" else data[:200]
    src: Any = BytesLoader(data) if why == "other-loader" else loader
    like_the_coordinator(w, src, meta)
    w.publish()
    assert not w.copied_whole
    assert fs.cat_file(f"{root}/dst.pte") == meta + data[200:]
    assert len(spy.calls) == (1 if why == "no-fs-copy" else 0)


def test_source_replaced_before_publish_is_refused(fs: Any, root: str) -> None:
    data, loader = source(fs, root)
    w = FsspecWriter(f"memory://{root}/dst.pte", fs=fs)
    like_the_coordinator(w, loader, random.randbytes(200))
    fs.pipe(f"{root}/src.pte", data + b"more")
    with pytest.raises(StorageError, match=r"src.pte: replaced while being read \(size 50000"):
        w.publish()
    assert not fs.exists(f"{root}/dst.pte")


def test_create_mode_refuses_an_existing_destination(fs: Any, root: str) -> None:
    data, loader = source(fs, root)
    fs.pipe(f"{root}/dst.pte", b"previous")
    w = FsspecWriter(f"memory://{root}/dst.pte", fs=fs)
    like_the_coordinator(w, loader, data[:200])
    message = (
        f"memory://{root}/dst.pte: already exists; publish(mode='create') never replaces an "
        "existing object"
    )
    with pytest.raises(AlreadyExists) as info:
        w.publish("create")
    assert str(info.value) == message
    assert fs.cat_file(f"{root}/dst.pte") == b"previous"


def test_passthrough_through_the_coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fx = get_fixture("mlp_xnnpack")
    assert fx.pte_path is not None
    (tmp_path / "in.pte").write_bytes(fx.pte_path.read_bytes())
    options = {"path": str(tmp_path), "target_protocol": "file"}
    dirfs = fsspec.filesystem("dir", **options)
    spy = Spy(dirfs, monkeypatch)
    ptestore.specialize(
        "dir://in.pte",
        "dir://out.pte",
        backends=["passthrough"],
        storage_options=options,
        provenance=False,
    )
    assert spy.calls == [("in.pte", "out.pte")]
    assert (tmp_path / "out.pte").read_bytes() == fx.pte_path.read_bytes()


class _AnswerLost(MemoryFileSystem):  # type: ignore[misc]
    """Stores each upload, then loses the answer of the first ``lose`` of them."""

    protocol = "answerlost"
    root_marker = "/"
    lose = 1
    calls = 0

    def put_file(
        self, lpath: str, rpath: str, callback: Any = None, mode: str = "overwrite", **kw: Any
    ) -> None:
        type(self).calls += 1
        super().put_file(lpath, rpath, mode=mode, **kw)
        if type(self).calls <= type(self).lose:
            raise ConnectionResetError("connection reset after the upload was stored")


@pytest.mark.parametrize(("mode", "lose"), [("create", 1), ("overwrite", 99)])
def test_an_upload_whose_answer_was_lost_is_uncertain_not_failed(mode: str, lose: int) -> None:
    """A retried ``create`` meets the writer's own object, an ``overwrite`` whose every
    answer is lost may have stored it: neither says the publish failed."""
    from ptestore.errors import PublishUncertain

    fs = _AnswerLost(skip_instance_cache=True)
    _AnswerLost.calls, _AnswerLost.lose = 0, lose
    name = f"{uuid.uuid4().hex}.bin"
    w = FsspecWriter(f"answerlost://{name}", fs=fs, retry_initial=0.001, retry_max=0.001)
    w.write(b"NEW", 0)
    with pytest.raises(PublishUncertain) as err:
        w.publish(mode)  # type: ignore[arg-type]
    cause = (
        "FileExistsError"
        if mode == "create"
        else ("ConnectionResetError: connection reset after the upload was stored")
    )
    assert str(err.value) == (
        f"answerlost://{name}: the upload at publish failed after {_AnswerLost.calls} "
        f"attempt(s) ({cause}): the destination holds either its previous content or the "
        "complete new output; check it before relying on either"
    )
    stored = [bytes(f.getvalue()) for key, f in fs.store.items() if key.endswith(name)]
    assert _AnswerLost.calls >= 2 and stored == [b"NEW"]


def _copy_that(fs: Any, monkeypatch: pytest.MonkeyPatch, before: Any) -> None:
    """``fs.copy`` runs ``before(path1)`` first (the source replaced, an interrupt...)."""
    original = fs.copy

    def copy(path1: str, path2: str, **kw: Any) -> Any:
        before(path1)
        return original(path1, path2, **kw)

    monkeypatch.setattr(fs, "copy", copy)


@pytest.mark.parametrize("mode", ["create", "overwrite"])
def test_source_replaced_during_the_copy_is_uncertain(
    fs: Any, root: str, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The filesystem's copy is the commit step: the source replaced while it runs (its
    re-check after the copy fails) leaves the destination holding the changed source's
    bytes, so the publish is uncertain, never "nothing was published"; the commit hook
    ran before the copy."""
    data, loader = source(fs, root)
    changed = data + b"more"
    _copy_that(fs, monkeypatch, lambda path: fs.pipe(path, changed))
    dst = f"{root}/dst.pte"
    w = FsspecWriter(f"memory://{dst}", fs=fs)
    seen: list[bool] = []
    w.commit_hook = lambda _: seen.append(fs.exists(dst))
    like_the_coordinator(w, loader, data[:200])
    with pytest.raises(PublishUncertain) as info:
        w.publish(mode)  # type: ignore[arg-type]
    assert str(info.value) == (
        f"memory://{dst}: the source memory://{root}/src.pte changed while the filesystem "
        f"copied it (memory://{root}/src.pte: replaced while being read (size 50000 -> 50004, "
        "etag None -> None); its content may be a mix of two versions): the copy is done, so "
        "the destination may hold the changed source's bytes rather than this output; check "
        "it before relying on it"
    )
    assert seen == [False]
    assert fs.cat_file(dst) == changed
    assert w.state is WriterState.DISCARDED


def test_an_interrupt_during_the_copy_is_uncertain(
    fs: Any, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, loader = source(fs, root)

    def interrupt(_path: str) -> None:
        raise KeyboardInterrupt

    _copy_that(fs, monkeypatch, interrupt)
    w = FsspecWriter(f"memory://{root}/dst.pte", fs=fs)
    hooked: list[str] = []
    w.commit_hook = lambda _: hooked.append("hook")
    like_the_coordinator(w, loader, data[:200])
    with pytest.raises(PublishUncertain) as info:
        w.publish("create")
    assert str(info.value) == (
        f"memory://{root}/dst.pte: publishing was interrupted after its commit step began "
        "(KeyboardInterrupt): the destination holds either its previous content or the "
        "complete new output; check it before relying on either"
    )
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert hooked == ["hook"]


def test_a_filesystem_that_cannot_copy_runs_the_commit_hook_once(
    fs: Any, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy refused (``NotImplementedError``: nothing copied), the upload is the
    commit step: the hook ran once, before the copy was tried."""
    data, loader = source(fs, root)
    spy = Spy(fs, monkeypatch, fail=True)
    w = FsspecWriter(f"memory://{root}/dst.pte", fs=fs)
    hooked: list[int] = []
    w.commit_hook = lambda _: hooked.append(len(spy.calls))
    like_the_coordinator(w, loader, data[:200])
    w.publish("create")
    assert hooked == [0] and len(spy.calls) == 1
    assert fs.cat_file(f"{root}/dst.pte") == data


class _CopyLost(MemoryFileSystem):  # type: ignore[misc]
    """Copies, then loses the answer of every copy."""

    protocol = "copylost"
    root_marker = "/"

    def cp_file(self, path1: str, path2: str, **kw: Any) -> None:
        super().cp_file(path1, path2, **kw)
        raise ConnectionResetError("connection reset after the copy was done")


def test_a_copy_whose_answers_were_lost_is_uncertain() -> None:
    fs = _CopyLost(skip_instance_cache=True)
    root = f"/gen-{uuid.uuid4().hex}"
    data, loader = source(fs, root)
    w = FsspecWriter(f"copylost://{root}/dst.pte", fs=fs, retry_attempts=2, retry_initial=0.0)
    like_the_coordinator(w, loader, data[:200])
    with pytest.raises(PublishUncertain) as info:
        w.publish()
    assert str(info.value) == (
        f"copylost://{root}/dst.pte: the copy of memory://{root}/src.pte at publish failed "
        "after 2 attempt(s) (ConnectionResetError: connection reset after the copy was done): "
        "the destination holds either its previous content or the complete new output; check "
        "it before relying on either"
    )
    assert fs.cat_file(w.path) == data  # copied, by both attempts


def test_a_source_that_cannot_be_checked_after_the_copy_is_uncertain(
    fs: Any, root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, loader = source(fs, root)
    checks: list[int] = []

    def check_unchanged() -> None:
        checks.append(1)
        if len(checks) > 1:  # the one after the copy
            raise ConnectionResetError("reset while checking")

    monkeypatch.setattr(loader, "check_unchanged", check_unchanged)
    w = FsspecWriter(f"memory://{root}/dst.pte", fs=fs)
    like_the_coordinator(w, loader, data[:200])
    with pytest.raises(PublishUncertain) as info:
        w.publish("create")
    assert str(info.value) == (
        f"memory://{root}/dst.pte: the source memory://{root}/src.pte could not be checked "
        "after the copy (ConnectionResetError: reset while checking): the copy is done, so the "
        "destination may hold the changed source's bytes rather than this output; check it "
        "before relying on it"
    )
    assert fs.cat_file(f"{root}/dst.pte") == data
