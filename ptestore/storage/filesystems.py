"""A remote URL's fsspec filesystem: made from its storage options with one retry layer,
the caller's own or shared within bounds, and closed; for the loader
(:mod:`.remote`), the S3 writer's connection (:mod:`ptestore.writers.s3.config`) and
what calls fsspec itself (the fleet's orphan sweep, re-use listing, index listings and
preflight).

**One retry layer.** On S3 (:func:`one_retry_layer`) s3fs's own retry loop around each
request (``_call_s3``, 5 attempts with its own backoff) is cut to one attempt, and
botocore's retries are off (``total_max_attempts=1``) unless ``config_kwargs`` sets
``retries`` (:func:`s3_options`): nested, the three multiplied (3 x 5 x 5 = 75 requests
for a read on a dropped connection with ``retry_attempts=3``). The caller's
:class:`~ptestore._retry.RetryPolicy` (the ``retry_*`` options) is the one layer.

**Never fsspec's instance cache for S3.** fsspec keeps every filesystem made with
distinct options for the life of the process, and s3fs gives each its own aiobotocore
session (about 13 MB: botocore's parsed service model and endpoint rules), client and
aiohttp session: a process whose options change per call (short-lived STS tokens) grew
by that per call (120 calls: 120 filesystems, 1.7 GB), and a filesystem made before a
credentials file was rewritten kept signing with the key it first read. An s3fs
filesystem here (:func:`s3_filesystem`) is made with ``skip_instance_cache=True``, and
is either

- *shared* (what :func:`open_filesystem` gives by default: the loaders, whose hooks are
  not part of their API, the index listings; and an S3 writer's with
  ``skip_instance_cache=False``: the fleet index's many small objects): one per option
  set and per state of what a session resolves (:func:`session_key` but its arguments),
  at most :data:`FILESYSTEM_CACHE_SIZE` kept, least recently used dropped first, and
  every one made under another state dropped as soon as one is made under the current
  one: a credentials file rewritten by a sidecar gives the next user a client that
  reads it. Each user holds it until it calls :func:`close_filesystem` (a loader's
  ``close``); one the cache dropped is closed when its last user lets it go;
- or the caller's *own* (``skip_instance_cache=True`` in the options, ``fresh``; an S3
  writer's by default, whose hooks are its own): :func:`close_filesystem` closes its
  client's connections.

Either way its aiobotocore session (the costly part of a client) is the process's
:func:`shared_session` for the current :func:`session_key`: the process id, s3fs's
session arguments (``profile``), every ``AWS_*`` environment variable, the size,
modification and status-change times, inode and device of the AWS config and
credentials files (a same-size file renamed over one with its ``mtime`` restored, as
``cp -p`` and ``rsync -t`` do, is a rotation too); at most
:data:`SESSION_CACHE_SIZE` kept. A client made from a warm session costs a few ms, one
from a fresh session about 75 ms of CPU; a credentials file rewritten (a sidecar's
rotation) is a new key, hence a new session that reads it. botocore gives every client a
copy of its session's event emitter, so hooks registered on one client's
``meta.events`` never reach another; a ``session`` given in the options is used as it
is. Other protocols are made as fsspec makes them (``fresh``: a filesystem of its own),
an ``http(s)://`` one with the guard of its redirects (:mod:`.redirects`: a ``get_client``
whose text is its rule, so fsspec's instance cache keeps one per option set and rule).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from .._log import get_logger
from .._retry import RetryPolicy
from ..errors import ConfigurationError
from .types import StorageURL

__all__ = [
    "FILESYSTEM_CACHE_SIZE",
    "NO_BOTOCORE_RETRIES",
    "SESSION_CACHE_SIZE",
    "close_filesystem",
    "fresh_info",
    "fs_class",
    "is_s3fs",
    "one_retry_layer",
    "open_filesystem",
    "s3_filesystem",
    "s3_options",
    "session_key",
    "shared_session",
]

log = get_logger("ptestore.storage")

#: botocore's retries off: :class:`~ptestore._retry.RetryPolicy` is the one layer.
NO_BOTOCORE_RETRIES = {"total_max_attempts": 1, "mode": "standard"}
#: aiobotocore sessions kept per process (least recently used dropped first).
SESSION_CACHE_SIZE = 8
#: Shared s3fs filesystems kept per process (``skip_instance_cache=False``).
FILESYSTEM_CACHE_SIZE = 8

_sessions: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_sessions_lock = threading.Lock()
#: Shared filesystems by ``(state, digest of the class and options)``.
_filesystems: OrderedDict[tuple[Any, str], Any] = OrderedDict()
_filesystems_lock = threading.Lock()
#: The attribute of a shared filesystem that holds its :class:`_Lease`.
_LEASE = "_ptestore_lease"


def _locks_anew() -> None:
    """A forked child's locks: one another thread of the parent held at the fork (making
    a filesystem, its first import of aiobotocore) would never be released there."""
    global _sessions_lock, _filesystems_lock
    _sessions_lock, _filesystems_lock = threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_locks_anew)


class _Lease:
    """How many users hold a shared filesystem now, the state it was made under, and
    whether the cache dropped it (then the last user to let it go closes it)."""

    __slots__ = ("dropped", "state", "users")

    def __init__(self, state: tuple[Any, ...]) -> None:
        self.state = state
        self.users = 0
        self.dropped = False


def fs_class(url: StorageURL) -> type:
    """The fsspec filesystem class of ``url``'s protocol (fsspec imported here: local
    files never need it); :class:`~ptestore.errors.ConfigurationError` for one fsspec
    cannot read."""
    import fsspec

    try:
        cls: type = fsspec.get_filesystem_class(url.protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(
            f"{url.text}: cannot read protocol {url.protocol!r}: {exc}"
        ) from exc
    return cls


def is_s3fs(fs: Any) -> bool:
    """Whether ``fs`` is an s3fs filesystem (known by its module, without importing s3fs)."""
    return _is_s3fs_class(type(fs))


def _is_s3fs_class(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "s3fs"


def s3_options(fs_cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for an s3fs filesystem class with botocore's retries off (unless
    ``config_kwargs`` sets ``retries``); other classes' options as they are."""
    if not _is_s3fs_class(fs_cls):
        return options
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", dict(NO_BOTOCORE_RETRIES))
    return {**options, "config_kwargs": config}


def one_retry_layer(fs: Any) -> Any:
    """``fs`` with s3fs's own retry loop cut to one attempt (an s3fs filesystem; any
    other is returned as it is): every request made through it (``GetObject``, the
    ``HEAD`` of ``info``, a listing) is then retried by the caller's
    :class:`RetryPolicy` only. s3fs reads ``retries`` per call from the instance."""
    if is_s3fs(fs):
        fs.retries = 1
    return fs


def fresh_info(fs: Any, path: str) -> dict[str, Any]:
    """``fs.info(path)`` asked of the store itself, never of a listing cached earlier.

    fsspec filesystems cache directory listings per instance, and an instance may be
    shared (fsspec's cache for other protocols, a filesystem handed to
    :class:`~ptestore.storage.remote.FsspecLoader` by an application), so an ``ls``
    would otherwise answer a later "is the source unchanged" question with what it saw
    before. The cached entry is invalidated and s3fs is asked with ``refresh=True`` (a
    HEAD every time)."""
    invalidate = getattr(fs, "invalidate_cache", None)
    if callable(invalidate):
        invalidate(path)
    if is_s3fs(fs):
        info: dict[str, Any] = fs.info(path, refresh=True)
        return info
    out: dict[str, Any] = fs.info(path)
    return out


def open_filesystem(
    url: StorageURL, options: Mapping[str, Any], *, fresh: bool = False
) -> tuple[Any, str, RetryPolicy]:
    """``(filesystem, path, policy)`` for the remote ``url``: the fsspec filesystem of
    its protocol made from ``options`` (a loader's: the filesystem's own and the
    ``retry_*`` ones), the path it gives ``url``, and the :class:`RetryPolicy` the
    ``retry_*`` options make, the one retry layer of every request made through that
    filesystem (s3fs's and botocore's retries off). On S3 it is the process's shared
    one for these options and the credentials' state (:func:`s3_filesystem`), or with
    ``skip_instance_cache=True`` the caller's own: either way the caller lets it go with
    :func:`close_filesystem`. ``fresh``: a filesystem of its own whatever the options
    say (nor cached listings shared). :class:`~ptestore.errors.ConfigurationError` for
    a bad retry option or options the filesystem class refuses."""
    fs_cls = fs_class(url)
    opts = dict(options)
    retry = RetryPolicy.from_options(url.text, opts)
    opts = s3_options(fs_cls, opts)
    if fresh:
        opts["skip_instance_cache"] = True
    from .redirects import guarded_options, is_http_class

    if is_http_class(fs_cls):  # where its redirects may go, and with what (.redirects)
        opts = guarded_options(url, opts)
    try:
        if _is_s3fs_class(fs_cls):
            own = bool(opts.pop("skip_instance_cache", False))
            fs = s3_filesystem(fs_cls, opts, shared=not own)
        else:
            fs = fs_cls(**opts)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{url.text}: bad storage options: {exc}") from exc
    path = url.path if url.protocol in ("s3", "memory") else fs._strip_protocol(url.text)
    return one_retry_layer(fs), path, retry


def s3_filesystem(fs_cls: type, options: Mapping[str, Any], *, shared: bool) -> Any:
    """An s3fs filesystem of ``fs_cls`` made from ``options``, never from fsspec's
    instance cache (the module docstring): ``shared``, the process's one for these
    options and the current state of the credentials, held by the caller until it calls
    :func:`close_filesystem`; else the caller's own. Its session is
    :func:`shared_session`'s unless the options give one. TypeError/ValueError for
    options the class refuses."""
    opts = dict(options)
    opts.pop("skip_instance_cache", None)
    if not shared:
        return _made(fs_cls, opts)
    state = _state()
    text = repr((fs_cls.__module__, fs_cls.__qualname__, sorted(opts.items())))
    key = (state, hashlib.sha256(text.encode()).hexdigest())
    closing: list[Any] = []
    with _filesystems_lock:
        fs = _filesystems.get(key)
        if fs is not None:
            _filesystems.move_to_end(key)
        else:
            fs = _made(fs_cls, opts)
            setattr(fs, _LEASE, _Lease(state))
            for old in [k for k in _filesystems if k[0] != state]:  # never asked for again
                closing += _dropped(_filesystems.pop(old))
            _filesystems[key] = fs
            while len(_filesystems) > FILESYSTEM_CACHE_SIZE:
                closing += _dropped(_filesystems.popitem(last=False)[1])
        getattr(fs, _LEASE).users += 1
    for old_fs in closing:
        _close(old_fs)
    return fs


def _dropped(fs: Any) -> list[Any]:
    """``fs``, dropped from the cache (under its lock), if it is to be closed now: no
    user holds it, and it was made in this process (a forked child never closes its
    parent's connections)."""
    lease: _Lease = getattr(fs, _LEASE)
    lease.dropped = True
    return [fs] if lease.users <= 0 and lease.state[0] == os.getpid() else []


def _made(fs_cls: type, opts: dict[str, Any]) -> Any:
    fs = fs_cls(skip_instance_cache=True, **opts)
    if fs.session is None:  # no session given: the process's shared one
        fs.session = shared_session(fs.kwargs)
    return fs


def close_filesystem(fs: Any) -> None:
    """Let ``fs`` go: an s3fs filesystem of the caller's own has its client's
    connections closed now, on s3fs's event loop; a shared one (:func:`s3_filesystem`)
    is released, and closed when the cache dropped it and this was its last user.
    Another protocol's is left as it is. Left to garbage collection, s3fs closes a
    client from whichever thread collects its filesystem (an fsspec filesystem is always
    in a reference cycle), and in a thread that runs an event loop of its own (a Dask
    worker's) that fails with "attached to a different loop". Call it once per
    :func:`open_filesystem`; a failure to close is logged (debug): the connections go
    with the process at worst."""
    if not is_s3fs(fs):
        return
    lease: _Lease | None = getattr(fs, _LEASE, None)
    if lease is not None:
        with _filesystems_lock:
            lease.users -= 1
            if not lease.dropped or lease.users != 0 or lease.state[0] != os.getpid():
                return
    _close(fs)


def _close(fs: Any) -> None:
    creator = getattr(fs, "_s3creator", None)
    if creator is None:  # never connected
        return
    import fsspec.asyn

    try:
        fsspec.asyn.sync(fs.loop, creator.__aexit__, None, None, None)
    except Exception as exc:
        log.debug("closing an S3 client failed: %s", exc)


def _file_state(path: str) -> tuple[int, ...] | None:
    """What tells a config or credentials file from the one read before: its size,
    ``mtime``, ``ctime``, inode and device. ``mtime`` and size alone miss a rotation
    that keeps both (a new file of the same length renamed over the old one with its
    time restored, as ``cp -p`` or ``rsync -t`` do); no call sets ``ctime`` back."""
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino, st.st_dev


def _state() -> tuple[Any, ...]:
    """The process id, every ``AWS_*`` environment variable and the state of the AWS
    config and credentials files: what an aiobotocore session resolves, but its
    arguments."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    files = (
        os.environ.get("AWS_CONFIG_FILE", "~/.aws/config"),
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
    )
    return os.getpid(), env, tuple(_file_state(f) for f in files)


def session_key(session_kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What decides what an aiobotocore session resolves, in this process: the pid, the
    session's arguments (s3fs passes ``profile`` and other unknown options), every
    ``AWS_*`` environment variable and the state of the AWS config/credentials files."""
    pid, env, files = _state()
    return (pid, repr(sorted(session_kwargs.items())), env, files)


def shared_session(session_kwargs: dict[str, Any]) -> Any:
    """The process's ``aiobotocore.session.AioSession(**session_kwargs)`` for the current
    :func:`session_key` (made on first use; clients made from it are each their own)."""
    import aiobotocore.session

    key = session_key(session_kwargs)
    with _sessions_lock:
        session = _sessions.get(key)
        if session is not None:
            _sessions.move_to_end(key)
            return session
        session = aiobotocore.session.AioSession(**session_kwargs)
        _sessions[key] = session
        while len(_sessions) > SESSION_CACHE_SIZE:
            _sessions.popitem(last=False)
        return session
