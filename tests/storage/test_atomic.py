"""``put_bytes``/``get_bytes``: the one small-file atomic write (temporary file beside
the target, fsync, rename or link, directory fsync; remote: the scheme's writer), and the
durability primitives the in-place journal and the resumable download use."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ptestore.errors import (
    AlreadyExists,
    ConfigurationError,
    ObjectNotFound,
    PermissionDenied,
    StorageError,
)
from ptestore.storage.atomic import get_bytes, put_bytes, rename, temp_name
from ptestore.testing.s3server import S3TestServer
from ptestore.writers.local import TEMP_NAME_RE


def _listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_put_then_get_overwrites_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    put_bytes(target, b"one")
    assert get_bytes(target) == b"one"
    put_bytes(f"file://{target}", memoryview(b"two!"))
    assert target.read_bytes() == b"two!"
    put_bytes(f"FILE://{target}", bytearray())  # an empty object is one too
    assert get_bytes(target) == b""
    assert _listing(tmp_path) == ["m.json"]


def test_create_never_replaces(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    put_bytes(target, b"first", mode="create")
    with pytest.raises(AlreadyExists, match=rf"^{target}: exists already \(mode 'create'\)$"):
        put_bytes(target, b"second", mode="create")
    assert target.read_bytes() == b"first"
    assert _listing(tmp_path) == ["m.json"]


def test_the_temporary_name_is_the_writers_so_gc_finds_a_leftover(tmp_path: Path) -> None:
    name = os.path.basename(temp_name(str(tmp_path / "m.json")))
    match = TEMP_NAME_RE.match(name)
    assert match is not None and match["name"] == "m.json"
    assert temp_name("m.json") != temp_name("m.json")


class _Trace:
    """Records the file-system calls of a put (the real calls run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fds: dict[int, str] = {}
        self.directory = str(directory)
        real_open, real_write, real_fsync = os.open, os.write, os.fsync
        real_replace, real_link = os.replace, os.link

        def name(path: Any) -> str:
            p = os.fspath(path)
            if p == self.directory:
                return "<dir>"
            return "<temp>" if TEMP_NAME_RE.match(os.path.basename(p)) else os.path.basename(p)

        def open_(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
            fd = real_open(path, flags, mode, **kw)
            self.fds[fd] = name(path)
            if flags & os.O_CREAT:
                self.calls.append(("create-excl" if flags & os.O_EXCL else "create", name(path)))
            return fd

        def write(fd: int, data: Any) -> int:
            self.calls.append(("write", self.fds.get(fd, "?")))
            return real_write(fd, data)

        def fsync(fd: int) -> None:
            self.calls.append(("fsync", self.fds.get(fd, "?")))
            real_fsync(fd)

        def replace(a: Any, b: Any) -> None:
            self.calls.append(("replace", f"{name(a)}->{name(b)}"))
            real_replace(a, b)

        def link(a: Any, b: Any) -> None:
            self.calls.append(("link", f"{name(a)}->{name(b)}"))
            real_link(a, b)

        for call, fn in (
            ("open", open_),
            ("write", write),
            ("fsync", fsync),
            ("replace", replace),
            ("link", link),
        ):
            monkeypatch.setattr(os, call, fn)


def test_the_durable_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _Trace(monkeypatch, tmp_path)
    put_bytes(tmp_path / "m.json", b"x" * 10)
    assert trace.calls == [
        ("create-excl", "<temp>"),
        ("write", "<temp>"),
        ("fsync", "<temp>"),
        ("replace", "<temp>->m.json"),
        ("fsync", "<dir>"),
    ]
    trace.calls.clear()
    put_bytes(tmp_path / "n.json", b"y", mode="create")
    assert trace.calls == [
        ("create-excl", "<temp>"),
        ("write", "<temp>"),
        ("fsync", "<temp>"),
        ("link", "<temp>->n.json"),
        ("fsync", "<dir>"),
    ]
    trace.calls.clear()
    put_bytes(tmp_path / "m.json", b"z", durable=False)
    assert [c for c, _ in trace.calls] == ["create-excl", "write", "replace"]
    assert _listing(tmp_path) == ["m.json", "n.json"]


def _failing(err: int, real: Callable[..., Any], only_temp: bool = True) -> Callable[..., Any]:
    def fail(fd: int, *args: Any) -> Any:
        if not only_temp or not os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(err, os.strerror(err))
        return real(fd, *args)

    return fail


def test_an_fsync_failure_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    monkeypatch.setattr(os, "fsync", _failing(errno.EIO, os.fsync))
    with pytest.raises(
        StorageError,
        match=rf"^{target}: fsync of the temporary file failed: Input/output error; nothing "
        r"was published \(fsync is never retried\)$",
    ):
        put_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert _listing(tmp_path) == ["m.json"]


def test_a_full_disk_publishes_nothing_and_keeps_its_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    monkeypatch.setattr(os, "write", _failing(errno.ENOSPC, os.write, only_temp=False))
    with pytest.raises(
        StorageError, match=rf"^{target}: cannot write: No space left on device$"
    ) as info:
        put_bytes(target, b"new")
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert target.read_bytes() == b"old"
    assert _listing(tmp_path) == ["m.json"]


def test_a_directory_fsync_failure_says_the_file_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "m.json"
    with pytest.raises(
        StorageError,
        match=rf"^{target}: published, but fsync of its directory failed: Input/output "
        r"error; it may not survive a crash \(not retried\)$",
    ):
        put_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert _listing(tmp_path) == ["m.json"]


def test_a_missing_directory_or_refused_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no" / "m.json"
    with pytest.raises(
        StorageError,
        match=rf"^{missing}: cannot create a temporary file: No such file or directory$",
    ):
        put_bytes(missing, b"x")
    real = os.open

    def refused(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", refused)
    target = tmp_path / "m.json"
    with pytest.raises(
        PermissionDenied, match=rf"^{target}: cannot create a temporary file: Permission denied$"
    ):
        put_bytes(target, b"x")


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The process's umask is 022 while the test runs (what a new file's mode is less)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("existing", [0o600, 0o755, 0o444], ids=oct)
def test_an_overwrite_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path, existing: int) -> None:
    """No permissions given: the new file takes the replaced file's mode, not 0666 less
    the umask (a private 0600 file stays private), as the local writer does; through a
    symbolic link, the mode of the file it names (the link itself is replaced)."""
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    target.chmod(existing)
    put_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert _mode(target) == existing
    named = tmp_path / "named.json"
    named.write_bytes(b"old")
    named.chmod(existing)
    link = tmp_path / "link.json"
    link.symlink_to(named)
    put_bytes(link, b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert _mode(link) == existing
    assert _listing(tmp_path) == ["link.json", "m.json", "named.json"]


@pytest.mark.usefixtures("umask_022")
def test_a_new_file_gets_0666_less_the_umask(tmp_path: Path) -> None:
    put_bytes(tmp_path / "m.json", b"x")
    put_bytes(tmp_path / "n.json", b"x", mode="create")
    assert _mode(tmp_path / "m.json") == _mode(tmp_path / "n.json") == 0o644


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize(
    ("permissions", "expected"),
    [(0o444, 0o444), (0o640, 0o640), (0o666, 0o644)],
    ids=["0o444", "0o640", "0o666"],
)
def test_explicit_permissions_win_over_the_replaced_files_mode(
    tmp_path: Path, permissions: int, expected: int
) -> None:
    """Given permissions are the file's, less the umask as for ``open``, whether it is
    new or replaces a file of another mode (XNNPACK's records are made 0444 so)."""
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    target.chmod(0o600)
    put_bytes(target, b"new", permissions=permissions)
    assert target.read_bytes() == b"new"
    assert _mode(target) == expected
    put_bytes(tmp_path / "n.json", b"new", permissions=permissions, mode="create")
    assert _mode(tmp_path / "n.json") == expected


def test_a_failing_chmod_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    target.chmod(0o600)
    monkeypatch.setattr(os, "fchmod", _failing(errno.EIO, os.fchmod))
    with pytest.raises(
        StorageError,
        match=rf"^{target}: cannot set mode 600 on the temporary file: Input/output error$",
    ):
        put_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert _listing(tmp_path) == ["m.json"]


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    with pytest.raises(
        ConfigurationError,
        match=rf"^{target}: publish mode must be 'overwrite' or 'create', got 'append'$",
    ):
        put_bytes(target, b"x", mode="append")  # type: ignore[arg-type]
    with pytest.raises(
        ConfigurationError,
        match=rf"^{target}: storage options \['key'\] do not apply to local files$",
    ):
        put_bytes(target, b"x", storage_options={"key": "k"})
    with pytest.raises(
        ConfigurationError,
        match=rf"^{target}: storage options \['key'\] do not apply to local files$",
    ):
        get_bytes(target, storage_options={"key": "k"})
    assert _listing(tmp_path) == []


def test_what_is_not_bytes_is_refused_and_a_long_name_is_published(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    for data in ("text", 123):
        with pytest.raises(ConfigurationError) as err:
            put_bytes(target, data)  # type: ignore[arg-type]
        assert str(err.value) == (
            f"{target}: put_bytes needs a bytes-like object, got {type(data).__name__}"
        )
    assert _listing(tmp_path) == []
    long = tmp_path / ("n" * 244)  # with the temporary name's affixes, past NAME_MAX
    put_bytes(long, b"abc")
    assert long.read_bytes() == b"abc" and _listing(tmp_path) == [long.name]


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_a_long_name_of_wide_characters_is_published(tmp_path: Path, char: str) -> None:
    """The temporary name is cut in bytes, at a character: a name of 2-, 3- and 4-byte
    characters close to NAME_MAX used to be cut at 200 *characters* (up to 800 bytes),
    and the temporary file could not be made (``File name too long``)."""
    from ptestore._text import head_bytes
    from ptestore.storage.atomic import temp_name

    name = char * (240 // len(char.encode())) + ".json"
    target = tmp_path / name
    put_bytes(target, b"abc")
    assert target.read_bytes() == b"abc" and _listing(tmp_path) == [name]
    tmp = os.path.basename(temp_name(str(target)))
    assert len(os.fsencode(tmp)) <= 255 and tmp.startswith("." + char)
    head = head_bytes(name, 200)
    assert name.startswith(head) and 200 - len(char.encode()) < len(head.encode()) <= 200
    undecodable = os.fsdecode(b"a\xff" + char.encode() * 100)
    assert head_bytes(undecodable, 3) == os.fsdecode(b"a\xff")  # the 2nd char not cut


def test_get_bytes_refuses_what_is_missing_or_too_large(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    with pytest.raises(ObjectNotFound, match=rf"^{target}: no such file$"):
        get_bytes(target)
    target.write_bytes(b"12345")
    with pytest.raises(StorageError) as info:
        get_bytes(target, limit=4)
    assert str(info.value) == f"{target}: 5 bytes, larger than the limit of 4 bytes"
    target.write_bytes(b"x" * 3_000_000)  # the size, not the limit + 1 bytes read
    with pytest.raises(StorageError) as info:
        get_bytes(target, limit=4)
    assert str(info.value) == f"{target}: 3000000 bytes, larger than the limit of 4 bytes"
    target.write_bytes(b"12345")
    assert get_bytes(target, limit=5) == b"12345"


def test_a_small_file_is_read_in_the_memory_its_size_needs(tmp_path: Path) -> None:
    """A bounded read asked for a buffer of its bound (a buffered ``read(limit + 1)``
    allocates it whole): a 20 KB index read within 1 GiB allocated 1 GiB. Each bounded
    reader of a local file, measured by ``tracemalloc``."""
    import tracemalloc

    from ptestore._io import read_bounded
    from ptestore.writers.versions import read_versioned

    target = tmp_path / "m.json"
    target.write_bytes(b"x" * 20_000)
    reads: list[Callable[[], Any]] = [
        lambda: get_bytes(target, limit=1 << 30),
        lambda: read_versioned(target, max_bytes=1 << 30),
    ]
    for read in reads:
        tracemalloc.start()
        try:
            read()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20
    with target.open("rb") as f:  # one past the bound, to tell a larger file
        assert read_bounded(f, 19_999) == b"x" * 20_000
    with target.open("rb") as f:
        assert read_bounded(f, 20_000) == b"x" * 20_000
    assert read_versioned(target, max_bytes=19_999).oversize == 20_000


def test_rename_moves_a_file_durably(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").write_bytes(b"a")
    (tmp_path / "b").write_bytes(b"b")
    trace = _Trace(monkeypatch, tmp_path)
    rename(str(tmp_path / "a"), str(tmp_path / "b"))
    assert trace.calls == [("replace", "a->b"), ("fsync", "<dir>")]
    assert _listing(tmp_path) == ["b"] and (tmp_path / "b").read_bytes() == b"a"
    with pytest.raises(
        ObjectNotFound, match=rf"^{tmp_path}/a: cannot rename to {tmp_path}/b: no such file$"
    ):
        rename(str(tmp_path / "a"), str(tmp_path / "b"))


def test_memory_urls_go_through_the_memory_writer() -> None:
    url = "memory://atomic-test/m.json"
    put_bytes(url, b"one")
    assert get_bytes(url) == b"one"
    with pytest.raises(AlreadyExists):
        put_bytes(url, b"two", mode="create")
    put_bytes(url, b"two")
    assert get_bytes(url) == b"two"
    with pytest.raises(StorageError) as info:
        get_bytes(url, limit=2)
    assert (
        str(info.value) == "memory://atomic-test/m.json: 3 bytes, larger than the limit of 2 bytes"
    )
    with pytest.raises(ConfigurationError, match=r"bogus"):
        put_bytes(url, b"x", storage_options={"bogus": 1})


@pytest.mark.s3
def test_s3_put_and_get(s3_server: S3TestServer) -> None:
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/dir/m.json"
    opts = s3_server.storage_options
    put_bytes(url, b"{}", storage_options=opts)
    assert get_bytes(url, storage_options=opts) == b"{}"
    with pytest.raises(AlreadyExists):
        put_bytes(url, b"[]", mode="create", storage_options=opts)
    put_bytes(url, b"[]", storage_options=opts)
    assert get_bytes(url, storage_options=opts) == b"[]"
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("permissions", [None, 0o644])
def test_root_overwriting_a_users_file_keeps_its_owner_unless_permissions_are_given(
    tmp_path: Path, permissions: int | None
) -> None:
    """Without permissions, as the local writer: the replaced file's owner and group, its
    permission bits without setuid or setgid. With them, ptestore's own file (a record, a
    manifest, the backends snapshot: trusted only when this user or root owns it)."""
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    os.chown(target, 1000, 1001)
    target.chmod(0o6640)
    put_bytes(target, b"new", permissions=permissions)
    st = os.stat(target)
    assert target.read_bytes() == b"new"
    if permissions is None:
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1001, 0o640)
    else:
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the case is root whose chown is refused")
def test_a_refused_chown_as_root_keeps_roots_owner_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Root whose chown is refused (an NFS export squashing root): published, its own
    owner, a warning naming both."""
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    os.chown(target, 1000, 1001)
    monkeypatch.setattr(os, "fchown", _failing(errno.EPERM, os.fchown))
    put_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert (os.stat(target).st_uid, os.stat(target).st_gid) == (0, 0)
    assert [r.getMessage() for r in caplog.records] == [
        f"{target}: the new file keeps the owner 0:0, not the replaced file's 1000:1001 "
        "(Operation not permitted)"
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
def test_a_failing_chown_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "m.json"
    target.write_bytes(b"old")
    os.chown(target, 1000, 1001)
    monkeypatch.setattr(os, "fchown", _failing(errno.EIO, os.fchown))
    with pytest.raises(
        StorageError,
        match=rf"^{target}: cannot give the new file the owner 1000:1001 of the file it "
        r"replaces: Input/output error$",
    ):
        put_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert _listing(tmp_path) == ["m.json"]
