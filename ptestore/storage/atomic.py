"""Small files written atomically: the one place outside the writers that renames and
fsyncs.

:func:`put_bytes` publishes a small object (a cache manifest, a snapshot, a resume
marker, a page) so that a reader sees the old content or the new, never a prefix:

- **local** (plain path, ``file://``): a temporary file in the destination's own
  directory (created with ``O_EXCL``, named as the writers name theirs,
  ``.NAME.ptestore-TOKEN.tmp``, so ``ptestore gc`` finds one a crash left), the bytes
  written, ``fsync`` (``F_FULLFSYNC`` on macOS), then ``rename`` over the destination
  (``mode="overwrite"``) or ``link`` to it (``mode="create"``: never replaces anything),
  then ``fsync`` of the directory. ``durable=False`` skips both fsyncs (the file is
  still never seen half-written). An fsync error is fatal and never retried: the
  temporary file is removed and nothing is published. The file's mode: the caller's
  ``permissions`` when given (less the umask, as for ``open``); else, replacing a
  regular file, that file's permission bits (as the local writer keeps them; never its
  setuid, setgid or sticky bit) and its owner and group as far as the process may
  (:func:`keep_owner`); else ``0o666`` less the umask. With ``permissions`` the file is
  the process's own (ptestore's records and manifests, which their readers trust only
  when this user or root owns them).
- **any other scheme**: the writer the scheme table names (:mod:`.schemes`, imported on
  first use), one ``write`` and one ``publish(mode)``: the store's atomic put.

:func:`get_bytes` reads one back, with a size limit. :func:`sync_file` and
:func:`sync_directory` are the durability primitives themselves, for the files that are
written in place rather than renamed (the in-place journal, a resumable download).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from typing import TYPE_CHECKING, Any, Literal

from .._io import read_bounded
from .._oserror import local_error
from ..errors import AlreadyExists, ConfigurationError, ObjectNotFound, StorageError
from .types import Buffer, StorageURL, URLLike, absolute_path, strerror

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "KEPT_BITS",
    "get_bytes",
    "keep_owner",
    "put_bytes",
    "rename",
    "replaced_mode",
    "rename_synced",
    "sync_directory",
    "sync_file",
    "temp_name",
]

#: A small object: what :func:`get_bytes` reads at most unless told otherwise.
DEFAULT_LIMIT = 1 << 20
#: The mode bits a local file that replaces another keeps from it: its permissions only;
#: never setuid, setgid or sticky (a model or a record is not a program, and the new file
#: may belong to someone else than the one it replaces).
KEPT_BITS = 0o777


def temp_name(path: str) -> str:
    """A fresh temporary name beside ``path`` (``.NAME.ptestore-<16 hex>.tmp``, the
    writers' pattern, which ``ptestore gc`` collects)."""
    from .._text import head_bytes

    directory, name = os.path.split(path)
    # the name cut as the writers' staging names are: under NAME_MAX for a long one
    head = head_bytes(name, 200)
    return os.path.join(directory, f".{head}.ptestore-{os.urandom(8).hex()}.tmp")


def sync_file(fd: int) -> None:
    """Make the file ``fd`` durable: ``fsync`` (``F_FULLFSYNC`` on macOS, where fsync
    does not flush the drive's cache). Raises ``OSError``; never retry one."""
    if sys.platform == "darwin":  # pragma: no cover - Linux CI
        import fcntl

        if hasattr(fcntl, "F_FULLFSYNC"):
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
            return
    os.fsync(fd)


def sync_directory(directory: str) -> None:
    """Make the names in ``directory`` durable (its ``fsync``); a file system that
    cannot fsync a directory (EINVAL, ENOTSUP) is not an error. Raises ``OSError``."""
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def rename(src: str, dst: str, *, durable: bool = True) -> None:
    """Rename the local file ``src`` over ``dst`` (one file system: atomic), then, with
    ``durable``, fsync ``dst``'s directory (and ``src``'s, when it is another one).

    Raises :class:`~ptestore.errors.StorageError` (``ObjectNotFound`` for a missing
    ``src``, ``PermissionDenied`` when refused) naming both paths."""
    try:
        os.replace(src, dst)
    except FileNotFoundError as exc:
        raise ObjectNotFound(f"{src}: cannot rename to {dst}: no such file") from exc
    except OSError as exc:
        raise local_error(exc, f"{src}: cannot rename to {dst}: {strerror(exc)}") from exc
    if durable:
        directories = {os.path.dirname(absolute_path(p)) for p in (dst, src)}
        for directory in sorted(directories):
            try:
                sync_directory(directory)
            except OSError as exc:
                raise local_error(
                    exc,
                    f"{dst}: renamed from {src}, but fsync of {directory} failed: "
                    f"{strerror(exc)}; it may not survive a crash (not retried)",
                ) from exc


def rename_synced(src: str, dst: str) -> None:
    """Publish the finished local file ``src`` as ``dst`` durably: fsync ``src``
    (:func:`sync_file`), then :func:`rename` it over ``dst`` with ``durable``. Raises
    ``OSError`` from the fsync, :class:`~ptestore.errors.StorageError` from the rename."""
    fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        sync_file(fd)
    finally:
        os.close(fd)
    rename(src, dst, durable=True)


def _check_mode(target: str, mode: str) -> None:
    if mode not in ("overwrite", "create"):
        raise ConfigurationError(
            f"{target}: publish mode must be 'overwrite' or 'create', got {mode!r}"
        )


def put_bytes(
    target: URLLike,
    data: Buffer,
    *,
    mode: Literal["overwrite", "create"] = "overwrite",
    durable: bool = True,
    permissions: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Publish ``data`` at ``target`` atomically (see the module docstring).

    Args:
        target: a local path, ``file://`` URL or any URL a writer serves.
        data: the whole content.
        mode: ``"overwrite"`` replaces what is there; ``"create"`` raises
            :class:`~ptestore.errors.AlreadyExists` if something is.
        durable: fsync the file before and its directory after the rename (local).
        permissions: the local file's mode bits, less the umask (as for ``open``),
            whether it is new or replaces one: XNNPACK's records are made 0444 so; the
            file is the process's own. ``None`` (the default): a file that replaces an
            existing regular file (``mode="overwrite"``, the target or what a link
            there names) keeps that file's permission bits and, as far as the process
            may, its owner and group, as :class:`~ptestore.writers.LocalFileWriter`
            does; a new file gets ``0o666`` less the umask.
        storage_options: for a remote target, the writer's options.

    Raises:
        AlreadyExists: ``mode="create"`` and ``target`` exists.
        PermissionDenied: access refused (a ``PermissionError`` too).
        StorageError: any other failure, naming ``target``; the cause is chained (an
            ``ENOSPC`` can be told by its ``errno``). Nothing was published.
    """
    url = StorageURL.of(target)
    _check_mode(url.text, mode)
    if not url.local:
        _put_remote(url, data, mode, dict(storage_options or {}))
        return
    if storage_options:
        raise ConfigurationError(
            f"{url.text}: storage options {sorted(storage_options)} do not apply to local files"
        )
    path = url.path
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise ConfigurationError(
            f"{path}: put_bytes needs a bytes-like object, got {type(data).__name__}"
        ) from None
    # without permissions the new file is "like the one it replaces": its mode and owner;
    # with them, ptestore's own file of that mode (a record, a manifest), the process's
    replaced = _replaced(path) if permissions is None and mode == "overwrite" else None
    kept = replaced_mode(replaced) if replaced is not None else None
    # a replaced file's mode is set exactly by fchmod below (the umask would take bits off)
    created = 0o600 if kept is not None else 0o666 if permissions is None else permissions
    tmp = temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, created)
    except OSError as exc:
        raise local_error(exc, f"{path}: cannot create a temporary file: {strerror(exc)}") from exc
    published = False
    try:
        try:
            _lock_temporary(fd)  # gc leaves a locked staging file alone, whatever its age
            if replaced is not None:
                keep_owner(fd, replaced, path)
            if kept is not None:
                try:
                    os.fchmod(fd, kept)
                except OSError as exc:
                    raise local_error(
                        exc,
                        f"{path}: cannot set mode {kept:o} on the temporary file: {strerror(exc)}",
                    ) from exc
            done = 0
            while done < view.nbytes:
                done += os.write(fd, view[done:])
            if durable:
                try:
                    sync_file(fd)
                except OSError as exc:
                    raise local_error(
                        exc,
                        f"{path}: fsync of the temporary file failed: {strerror(exc)}; "
                        "nothing was published (fsync is never retried)",
                    ) from exc
            try:
                if mode == "create":
                    os.link(tmp, path)
                else:
                    os.replace(tmp, path)
                published = True
            except FileExistsError as exc:
                raise AlreadyExists(f"{path}: exists already (mode 'create')") from exc
            except OSError as exc:
                raise local_error(exc, f"{path}: cannot publish: {strerror(exc)}") from exc
        finally:
            os.close(fd)  # (its lock with it: held until the file was published)
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        raise local_error(exc, f"{path}: cannot write: {strerror(exc)}") from exc
    finally:
        if mode == "create" or not published:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    if durable:
        try:
            sync_directory(os.path.dirname(path))
        except OSError as exc:
            raise local_error(
                exc,
                f"{path}: published, but fsync of its directory failed: {strerror(exc)}; "
                "it may not survive a crash (not retried)",
            ) from exc


def _replaced(path: str) -> os.stat_result | None:
    """What the regular file at ``path`` is (a link followed), None when there is none
    or it cannot be seen (the put reports what fails then)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def replaced_mode(st: os.stat_result) -> int:
    """The mode a file that replaces the one ``st`` describes takes: its permission bits
    (:data:`KEPT_BITS`), never its setuid, setgid or sticky bit."""
    return stat.S_IMODE(st.st_mode) & KEPT_BITS


def keep_owner(fd: int, st: os.stat_result, path: str) -> None:
    """Give the new file open at ``fd`` the owner and group of the file it replaces at
    ``path`` (``st``), as far as this process may: as root both (else a root process
    replacing a user's ``0640`` file would lock its owner out); otherwise the group, when
    the process is in it (its uid stays its own, as for any file it makes). A change the
    system refuses (``EPERM``; ``EINVAL``: an id the filesystem cannot map) leaves the
    process's own ids: silently for a user, with a warning for root (an NFS export that
    squashes root)."""
    mine = os.fstat(fd)
    root = os.geteuid() == 0
    uid = st.st_uid if root and st.st_uid != mine.st_uid else -1
    gid = st.st_gid if st.st_gid != mine.st_gid else -1
    if uid == -1 and gid == -1:
        return
    try:
        os.fchown(fd, uid, gid)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EINVAL):
            raise local_error(
                exc,
                f"{path}: cannot give the new file the owner {st.st_uid}:{st.st_gid} of the "
                f"file it replaces: {strerror(exc)}",
            ) from exc
        if root:
            from .._log import get_logger

            get_logger("ptestore.storage").warning(
                "%s: the new file keeps the owner %d:%d, not the replaced file's %d:%d (%s)",
                path,
                mine.st_uid,
                mine.st_gid,
                st.st_uid,
                st.st_gid,
                strerror(exc),
            )


def _put_remote(url: StorageURL, data: Buffer, mode: str, options: dict[str, Any]) -> None:
    from ._options import check_options
    from .schemes import scheme_of

    row = scheme_of(url)
    cls = row.writer_class(url)
    target = row.target(url)
    check_options(
        url.text, options, cls.accepted_options(target), row.writer_applies_to or row.applies_to
    )
    writer = cls(target, **options)
    try:
        writer.write(data, 0)
        writer.publish(mode)
    finally:
        writer.discard()  # a no-op once published


def get_bytes(
    source: URLLike,
    *,
    limit: int = DEFAULT_LIMIT,
    storage_options: Mapping[str, Any] | None = None,
) -> bytes:
    """The whole content of the small object at ``source``.

    Raises:
        ObjectNotFound: nothing there.
        StorageError: larger than ``limit`` bytes (the message names both sizes), or
            another read failure.
    """
    url = StorageURL.of(source)
    if url.local:
        if storage_options:
            raise ConfigurationError(
                f"{url.text}: storage options {sorted(storage_options)} do not apply to local files"
            )
        try:
            with open(url.path, "rb") as f:
                raw = read_bounded(f, limit)
                # over the bound: its size as the file says (it was read to limit + 1)
                size = max(os.fstat(f.fileno()).st_size, len(raw)) if len(raw) > limit else 0
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{url.path}: no such file") from exc
        except OSError as exc:
            raise local_error(exc, f"{url.path}: cannot read: {strerror(exc)}") from exc
        if len(raw) > limit:
            raise StorageError(_too_large(url.path, size, limit))
        return raw
    from .loaders import open_loader

    loader = open_loader(url, **dict(storage_options or {}))
    try:
        size = loader.size()
        if size > limit:
            raise StorageError(_too_large(url.text, size, limit))
        return bytes(loader.load(0, size))
    finally:
        loader.close()


def _too_large(where: str, size: int, limit: int) -> str:
    """What :func:`get_bytes` says of an object over its limit, local or remote."""
    return f"{where}: {size} bytes, larger than the limit of {limit} bytes"


def _lock_temporary(fd: int) -> None:
    """An exclusive lock on a temporary file while it is written and published, as the
    writers hold one on their staging files: ``ptestore gc`` removes a staging-named
    file only when no process holds its lock. Where the file system takes no lock
    (``ENOLCK``, ``EOPNOTSUPP``) the file goes without: its age protects it, as before."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
