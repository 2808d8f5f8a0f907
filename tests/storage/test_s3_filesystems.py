"""S3 loaders in a long-running process (:mod:`ptestore.storage.filesystems`): their
filesystems come from a bounded cache keyed on the options and on the state of the
credentials, never from fsspec's unbounded instance cache, and each is closed by its
last user once the cache drops it; one of a loader's own is closed when the loader is.

Before: one filesystem (with its own aiobotocore session, client and aiohttp session,
about 13 MB) per distinct option set for the life of the process (120 ``specialize``
calls with a per-call session token: 120 of each, 1.7 GB), and a loader opened after a
sidecar rewrote the credentials file still signed with the key before the rotation.
On moto and SeaweedFS (which refuses a key it does not know: the rotation is a 403,
then a read)."""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.aws_credentials import use_credentials_file, write_credentials

from ptestore.errors import PermissionDenied
from ptestore.storage import filesystems
from ptestore.storage.filesystems import FILESYSTEM_CACHE_SIZE
from ptestore.storage.loaders import open_loader
from ptestore.storage.remote import FsspecLoader
from ptestore.testing.s3server import S3TestServer

pytestmark = pytest.mark.s3

DATA = b"m" * 100


@pytest.fixture
def url(s3_server: S3TestServer) -> str:
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="m.pte", Body=DATA)
    return f"s3://{bucket}/m.pte"


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The collector off, as a busy process may leave it between passes: what is not
    closed explicitly stays open."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _open_sessions() -> int:
    """The aiohttp sessions alive and not closed in this process (the clients' pools)."""
    import aiohttp

    return sum(1 for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed)


def _filesystems() -> int:
    from s3fs import S3FileSystem

    return sum(1 for o in gc.get_objects() if isinstance(o, S3FileSystem))


def _closed(fs: Any) -> bool:
    """Whether the connections of ``fs``'s client were closed."""
    return fs.s3._endpoint.http_session._sessions is None


def _access_key(loader: FsspecLoader) -> str:
    key: str = loader.fs.s3._request_signer._credentials.access_key
    return key


def _per_call(s3_server: S3TestServer, i: int) -> dict[str, Any]:
    """Options that change per call, as an application's with short-lived credentials
    (moto takes any session token; SeaweedFS refuses one it did not issue, so there a
    user-agent suffix changes instead)."""
    if s3_server.name == "moto":
        return {**s3_server.storage_options, "token": f"session-token-{i}"}
    return {**s3_server.storage_options, "config_kwargs": {"user_agent_extra": f"call-{i}"}}


def test_options_changing_per_call_keep_a_bounded_number_of_clients(
    s3_server: S3TestServer, url: str, no_collector: None
) -> None:
    """3 x the bound of loaders, each with options of its own: at most the bound of
    filesystems and open aiohttp sessions more than before (was one of each per call,
    never freed: fsspec's instance cache held them); the ones dropped closed at once."""
    sessions, made = _open_sessions(), _filesystems()
    for i in range(3 * FILESYSTEM_CACHE_SIZE):
        with open_loader(url, **_per_call(s3_server, i)) as loader:
            assert loader.load(0, len(DATA)) == DATA
    assert _open_sessions() - sessions <= FILESYSTEM_CACHE_SIZE
    gc.collect()
    assert _filesystems() - made <= FILESYSTEM_CACHE_SIZE


def test_gc_of_uploads_with_options_changing_per_call_keeps_a_bounded_number_of_clients(
    s3_server: S3TestServer, url: str, no_collector: None
) -> None:
    """``collect_s3`` releases its connection's filesystem: 3 x the bound of calls with
    options of their own leave at most the bound of open aiohttp sessions (it never
    closed its connection: each call's filesystem stayed open, one more per call)."""
    from ptestore.gc import collect_s3

    prefix = url.rpartition("/")[0] + "/"
    sessions = _open_sessions()
    for i in range(3 * FILESYSTEM_CACHE_SIZE):
        assert collect_s3(prefix, older_than=0, **_per_call(s3_server, i)) == []
    assert _open_sessions() - sessions <= FILESYSTEM_CACHE_SIZE


def test_loaders_with_equal_options_share_one_client(s3_server: S3TestServer, url: str) -> None:
    """The common case keeps its one client (no client, nor TLS context, per loader);
    the application's own filesystem from fsspec is never it."""
    import fsspec

    first = open_loader(url, **s3_server.storage_options)
    second = open_loader(url, **s3_server.storage_options)
    assert isinstance(first, FsspecLoader) and isinstance(second, FsspecLoader)
    assert first.fs is second.fs and first.fs.s3 is second.fs.s3
    assert first.fs is not fsspec.filesystem("s3", **s3_server.storage_options)
    first.close()
    assert not _closed(second.fs) and second.load(0, len(DATA)) == DATA
    second.close()
    assert not _closed(second.fs)  # kept for the next loader


def test_a_dropped_filesystem_is_closed_by_its_last_user_not_under_it(
    s3_server: S3TestServer, url: str
) -> None:
    """A loader holding a filesystem the cache drops (the bound's worth of other option
    sets opened since) reads on; the filesystem is closed when the loader is, not
    before."""
    held = open_loader(url, **_per_call(s3_server, -1))
    assert isinstance(held, FsspecLoader)
    for i in range(FILESYSTEM_CACHE_SIZE):
        with open_loader(url, **_per_call(s3_server, i)):
            pass
    assert all(fs is not held.fs for fs in filesystems._filesystems.values())  # dropped
    assert not _closed(held.fs)
    assert held.load(0, len(DATA)) == DATA and held.load(1, 10) == DATA[1:11]
    held.close()
    assert _closed(held.fs)
    held.close()  # a second close does nothing


def test_a_loader_of_its_own_closes_its_client(s3_server: S3TestServer, url: str) -> None:
    """``skip_instance_cache=True``: the loader's own filesystem, shared with no other
    loader, its client closed with the loader (hooks on it reach no other)."""
    own = {**s3_server.storage_options, "skip_instance_cache": True}
    loader = open_loader(url, **own)
    other = open_loader(url, **own)
    assert isinstance(loader, FsspecLoader) and isinstance(other, FsspecLoader)
    assert loader.fs is not other.fs
    assert loader.load(0, len(DATA)) == DATA
    loader.close()
    assert _closed(loader.fs) and not _closed(other.fs)
    other.close()


def test_a_loader_opened_after_a_credentials_rotation_signs_with_the_new_key(
    s3_server: S3TestServer, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials from ``AWS_SHARED_CREDENTIALS_FILE``, rewritten by a sidecar between
    two loaders: the second signs with the new key and reads (was: the key before the
    rotation, fsspec's cached filesystem; on SeaweedFS a 403 after the rotation)."""
    good = s3_server.storage_options
    creds = tmp_path / "credentials"
    use_credentials_file(monkeypatch, creds)
    old_key = f"rotated-out-{uuid.uuid4().hex[:8]}"
    write_credentials(creds, old_key, "the-old-secret")
    endpoint = {"endpoint_url": good["endpoint_url"], "client_kwargs": good["client_kwargs"]}
    if s3_server.name == "seaweedfs":  # a key it does not know
        with pytest.raises(PermissionDenied):
            open_loader(url, **endpoint, retry_attempts=1)
    else:
        with open_loader(url, **endpoint, retry_attempts=1) as before:
            assert isinstance(before, FsspecLoader) and _access_key(before) == old_key
    write_credentials(creds, good["key"], good["secret"])  # the sidecar's rotation
    with open_loader(url, **endpoint, retry_attempts=1) as loader:
        assert isinstance(loader, FsspecLoader)
        assert _access_key(loader) == good["key"]
        assert loader.load(0, len(DATA)) == DATA


def test_a_child_forked_while_another_thread_makes_a_filesystem_can_make_one() -> None:
    """The cache's locks are made anew in a forked child: one a thread of the parent
    held at the fork (making a filesystem) would never be released there, and the
    child's first S3 open would wait for ever."""
    from support.locks import child_forked_under_them_takes

    from ptestore.storage import filesystems

    assert child_forked_under_them_takes(
        lambda: [filesystems._filesystems_lock, filesystems._sessions_lock]
    )


def test_a_rotation_that_keeps_the_files_size_and_mtime_is_seen(
    s3_server: S3TestServer, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rotation as ``cp -p`` or ``rsync -t`` make it: a new credentials file of the
    same length renamed over the old one, the old file's modification time given to it.
    A loader opened after it signs with the new key (was: the session cached for the old
    file's ``(mtime, size)``, the old key; on SeaweedFS a 403)."""
    good = s3_server.storage_options
    creds = tmp_path / "credentials"
    use_credentials_file(monkeypatch, creds)
    old_key = ("R" * len(good["key"]))[: len(good["key"])]
    old_secret = "s" * len(good["secret"])
    write_credentials(creds, old_key, old_secret)
    endpoint = {"endpoint_url": good["endpoint_url"], "client_kwargs": good["client_kwargs"]}
    if s3_server.name == "seaweedfs":  # a key it does not know
        with pytest.raises(PermissionDenied):
            open_loader(url, **endpoint, retry_attempts=1)
    else:
        with open_loader(url, **endpoint, retry_attempts=1) as before:
            assert isinstance(before, FsspecLoader) and _access_key(before) == old_key
    old = creds.stat()
    new = tmp_path / "credentials.new"
    write_credentials(new, good["key"], good["secret"])
    os.utime(new, ns=(old.st_atime_ns, old.st_mtime_ns))  # cp -p, rsync -t
    os.replace(new, creds)
    st = creds.stat()
    assert (st.st_size, st.st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    with open_loader(url, **endpoint, retry_attempts=1) as loader:
        assert isinstance(loader, FsspecLoader)
        assert _access_key(loader) == good["key"]
        assert loader.load(0, len(DATA)) == DATA
