"""Make, bind, verify and find XNNPACK packed-weight files.

One file per identity (:mod:`.identity`) in a directory, beside it a record and a lock::

    <dir>/xnnpack-<id>.xpwc        the packed weights, read-only (0444)
    <dir>/xnnpack-<id>.xpwc.json   its record: identity, size, SHA-256, entries
    <dir>/xnnpack-<id>.xpwc.lock   flock of whoever makes it
    <dir>/xnnpack-<id>.refused.json  why the runtime cannot have one (made once)

:func:`make_cache` (under the lock): a verified file is returned as is; anything else
under the name (missing, corrupt, stale, half made by a killed maker) is removed and made
again. Making runs the stock runtime in a child process twice: once loading every method
without the cache (the reference) and then with the cache at a private temporary path,
and once more in a fresh child with the finished file; the file must parse (footer,
index in bounds, entry names made of the artifact's XNNPACK keys) before any runtime is
pointed at it, and every output of every method must equal the reference bit for bit.
Only then is it published: fsync, 0444, rename into the directory, then the record the
same way (the record is what makes a file findable). :func:`find_cache` and
:func:`verify_cache` hand a file out only when its record names this identity and its
size and SHA-256 match.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    ConfigurationError,
    FormatError,
    IntegrityError,
    PackedWeightsRefused,
    PteStoreError,
    StorageError,
)
from .identity import Identity, file_sha256
from .native import ExecutorchBuild, Shim, build_shim, executorch_build
from .xpwc import Entry, check_names, parse_index

__all__ = [
    "RECORD_FORMAT",
    "CacheFile",
    "artifact_keys",
    "find_cache",
    "make_cache",
    "verify_cache",
]

RECORD_FORMAT = "ptestore-xnnpack-cache/1"
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class CacheFile:
    """A verified packed-weight file and what it is bound to."""

    path: Path
    record_path: Path
    size: int
    sha256: str
    entries: int
    identity: Identity
    #: True when this call made it, False when it was found.
    made: bool = False
    #: Seconds the making took (children included), when this call made it.
    make_seconds: float | None = None

    @property
    def files(self) -> tuple[Path, Path]:
        """The two files that make it up (the packed weights and the record): what a
        cache that counts bytes or evicts (LRU) should account for and remove together,
        the record first."""
        return (self.record_path, self.path)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "size": self.size,
            "sha256": self.sha256,
            "entries": self.entries,
            "identity": self.identity.to_json(),
            "made": self.made,
        }


def artifact_keys(pte: PathLike) -> set[str]:
    """The named-data keys the XNNPACK delegate graphs of a .pte refer to."""
    from ..format.reader import read_container
    from ..format.tensors import xnnpack_tensors
    from ..storage.loaders import LocalFileLoader

    loader = LocalFileLoader(os.fspath(pte))
    try:
        parsed = read_container(loader)
        return {key for key, _ in xnnpack_tensors(parsed, loader)}
    finally:
        loader.close()


def _identity(
    pte: PathLike,
    ptd: PathLike | None,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    build: ExecutorchBuild,
) -> Identity:
    pte_digest = pte_sha256 or file_sha256(pte)
    ptd_digest = None if ptd is None else (ptd_sha256 or file_sha256(ptd))
    return Identity.of(pte_digest, ptd_digest, build)


def _paths(directory: Path, identity: Identity) -> tuple[Path, Path, Path, Path]:
    base = directory / f"{identity.name}.xpwc"
    return (
        base,
        base.with_name(base.name + ".json"),
        base.with_name(base.name + ".lock"),
        directory / f"{identity.name}.refused.json",
    )


def _stamp(st: os.stat_result) -> dict[str, int]:
    return {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def _check_file(
    path: Path, record: dict[str, Any], identity: Identity, full: bool = True
) -> CacheFile:
    """The checks before a file is handed out; raises what is wrong. ``full=False``
    skips the SHA-256 when the file is still the inode published with the record, never
    changed since (device, inode, size, mtime and ctime as recorded: any write, chmod,
    copy or replacement changes one of them)."""
    source = str(path)
    if record.get("format") != RECORD_FORMAT:
        raise FormatError(source + ".json", "format", record.get("format"), repr(RECORD_FORMAT))
    recorded = record.get("identity")
    if not isinstance(recorded, dict):
        raise FormatError(source + ".json", "identity", recorded, "an object")
    diff = identity.differences(recorded)
    if diff:
        raise IntegrityError(
            f"{source}: made for another artifact, runtime or CPU ({'; '.join(diff)})",
            published=False,
        )
    size, digest = record.get("size"), record.get("sha256")
    try:
        st = path.stat()
    except FileNotFoundError:
        raise IntegrityError(f"{source}: recorded but missing", published=False) from None
    if st.st_size != size:
        raise IntegrityError(f"{source}: size {st.st_size} != recorded {size}", published=False)
    if st.st_mode & 0o222:
        raise IntegrityError(
            f"{source}: mode {oct(st.st_mode & 0o777)} is writable; published files are 0444",
            published=False,
        )
    if not full and record.get("stamp") == _stamp(st) and isinstance(digest, str):
        actual = digest
    else:
        actual = file_sha256(path)
    if actual != digest:
        raise IntegrityError(f"{source}: SHA-256 {actual} != recorded {digest}", published=False)
    entries = _parse_file(path)
    if len(entries) != record.get("entries"):
        raise IntegrityError(
            f"{source}: {len(entries)} entries != recorded {record.get('entries')}",
            published=False,
        )
    return CacheFile(
        path, path.with_name(path.name + ".json"), st.st_size, actual, len(entries), identity
    )


def _parse_file(path: Path) -> list[Entry]:
    """The index of a file on disk, read through a read-only mapping."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return parse_index(b"", str(path))
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                return parse_index(view, str(path))
            finally:
                view.release()


def _read_record(record_path: Path) -> dict[str, Any]:
    try:
        data = json.loads(record_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise FormatError(str(record_path), "record", type(exc).__name__, "a JSON object") from None
    if not isinstance(data, dict):
        raise FormatError(str(record_path), "record", type(data).__name__, "a JSON object")
    return data


def verify_cache(
    path: PathLike,
    *,
    pte: PathLike,
    ptd: PathLike | None = None,
    pte_sha256: str | None = None,
    ptd_sha256: str | None = None,
    full: bool = True,
) -> CacheFile:
    """Check a packed-weight file against its record and against this artifact, runtime
    and CPU; the :class:`CacheFile`, or :class:`IntegrityError` / :class:`FormatError`
    saying what is wrong. ``pte_sha256``/``ptd_sha256``: the artifact's digests when the
    caller knows them (else the files are hashed). ``full=False``: the SHA-256 is skipped
    for a file that is still the inode published with its record and unchanged since
    (device, inode, size, mtime, ctime as recorded); any other file is hashed."""
    identity = _identity(pte, ptd, pte_sha256, ptd_sha256, executorch_build())
    p = Path(path)
    record_path = p.with_name(p.name + ".json")
    try:
        record = _read_record(record_path)
    except FileNotFoundError:
        raise IntegrityError(
            f"{p}: no record beside it ({record_path.name})", published=False
        ) from None
    return _check_file(p, record, identity, full)


def find_cache(
    pte: PathLike,
    *,
    ptd: PathLike | None = None,
    directory: PathLike,
    pte_sha256: str | None = None,
    ptd_sha256: str | None = None,
    full: bool = True,
) -> CacheFile | None:
    """The verified packed-weight file for this artifact, runtime and CPU in
    ``directory``, or None (none, or one that fails a check: :func:`make_cache` makes it
    again). Nothing is changed on disk."""
    identity = _identity(pte, ptd, pte_sha256, ptd_sha256, executorch_build())
    path, record_path, _, _ = _paths(Path(directory), identity)
    return _found(path, record_path, identity, full)


def _found(
    path: Path, record_path: Path, identity: Identity, full: bool = True
) -> CacheFile | None:
    try:
        return _check_file(path, _read_record(record_path), identity, full)
    except FileNotFoundError:
        return None
    except PteStoreError:
        return None


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish_bytes(data: bytes, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _remove_stale(directory: Path, identity: Identity) -> None:
    """Under the lock: everything a previous maker of this identity left."""
    path, record_path, _, _ = _paths(directory, identity)
    for p in (record_path, path):  # the record first: it is what makes a file findable
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    for leftover in directory.glob(f".{identity.name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


class _Child:
    """One run of :mod:`.child` and what it left."""

    def __init__(self, work: Path, tag: str) -> None:
        self.work = work
        self.tag = tag
        self.stderr_path = work / f"{tag}.stderr"

    def run(self, req: dict[str, Any], artifact: str, what: str, timeout: float | None) -> None:
        req_path = self.work / f"{self.tag}.json"
        req_path.write_text(json.dumps(req), encoding="utf-8")
        env = dict(os.environ)
        env.setdefault("PYTHONWARNINGS", "ignore")
        with open(self.stderr_path, "wb") as err:
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "ptestore.xnnpack.child", str(req_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                    timeout=timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise PackedWeightsRefused(
                    artifact, f"the runtime did not finish {what} within {timeout} s"
                ) from None
        rc = done.returncode
        if rc == 0:
            return
        if rc == 3 and (self.work / "error.json").is_file():
            reason = json.loads((self.work / "error.json").read_text(encoding="utf-8"))["reason"]
            raise PackedWeightsRefused(artifact, f"{what}: {reason}")
        if rc < 0:
            raise PackedWeightsRefused(
                artifact,
                f"the ExecuTorch runtime crashed ({_signal_name(-rc)}, exit {128 - rc}) "
                f"{what}{self.tail()}",
            )
        raise PackedWeightsRefused(artifact, f"the runtime exited with {rc} {what}{self.tail()}")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self) -> str:
        lines = [ln for ln in self.stderr().splitlines() if ln.strip()][-5:]
        return ("; its last messages: " + " | ".join(lines)) if lines else ""


def _load_outputs(path: Path) -> dict[str, Any]:
    import numpy as np

    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    out = []
    for name in sorted(set(got) | set(want)):
        g, w = got.get(name), want.get(name)
        if g is None or w is None:
            out.append(f"{name}: present in only one run")
        elif g.dtype != w.dtype or g.shape != w.shape:
            out.append(f"{name}: {g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}")
        elif g.tobytes() != w.tobytes():
            out.append(f"{name}: values differ")
    return out


def _report(work: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((work / f"{name}.json").read_text(encoding="utf-8"))
    return data


def make_cache(
    pte: PathLike,
    *,
    ptd: PathLike | None = None,
    directory: PathLike,
    pte_sha256: str | None = None,
    ptd_sha256: str | None = None,
    timeout: float | None = None,
    retry_refused: bool = False,
    full: bool = True,
) -> CacheFile:
    """The packed-weight file for this artifact, runtime and CPU in ``directory``: found
    and verified, or made now (see the module's description).

    Raises :class:`PackedWeightsRefused` naming the artifact and the reason when the
    runtime crashes or fails with the cache on, an output differs, or the graph cannot be
    cached; the refusal is remembered beside the file and raised again without running
    anything (``retry_refused=True`` tries again). ``timeout``: seconds for each child;
    ``full``: as for :func:`verify_cache`, for a file found."""
    started = time.perf_counter()
    shim = build_shim()
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    identity = _identity(pte, ptd, pte_sha256, ptd_sha256, shim.build)
    path, record_path, lock_path, refused_path = _paths(directory, identity)
    artifact = os.fspath(pte) if ptd is None else f"{os.fspath(pte)} (+ {os.fspath(ptd)})"
    with _locked(lock_path):
        found = _found(path, record_path, identity, full)
        if found is not None:
            return found
        if refused_path.is_file() and not retry_refused:
            with contextlib.suppress(OSError, ValueError, KeyError):
                reason = json.loads(refused_path.read_text(encoding="utf-8"))["reason"]
                raise PackedWeightsRefused(artifact, f"{reason} (refused before)")
        _remove_stale(directory, identity)
        try:
            made = _make(pte, ptd, shim, identity, directory, artifact, timeout)
        except PackedWeightsRefused as exc:
            _publish_bytes(
                json.dumps({"identity": identity.to_json(), "reason": exc.reason}).encode(),
                refused_path,
            )
            raise
        with contextlib.suppress(FileNotFoundError):
            refused_path.unlink()
    return CacheFile(
        made.path,
        made.record_path,
        made.size,
        made.sha256,
        made.entries,
        identity,
        made=True,
        make_seconds=time.perf_counter() - started,
    )


def _make(
    pte: PathLike,
    ptd: PathLike | None,
    shim: Shim,
    identity: Identity,
    directory: Path,
    artifact: str,
    timeout: float | None,
) -> CacheFile:
    path, record_path, _, _ = _paths(directory, identity)
    keys = artifact_keys(pte)
    if not keys:
        raise PackedWeightsRefused(
            artifact, "it has no XNNPACK delegate with named weights (nothing to pack)"
        )
    work = Path(tempfile.mkdtemp(dir=directory, prefix=f".{identity.name}."))
    try:
        tmp_file = work / "packed.xpwc"
        limit = 255
        if len(os.fsencode(tmp_file)) > limit:
            raise ConfigurationError(
                f"{directory}: too long for the runtime's packed_cache_path option "
                f"({len(os.fsencode(tmp_file))} bytes with the file name, at most {limit})"
            )
        base = {
            "shim": str(shim.path),
            "runtime": str(shim.build.runtime_library),
            "pte": os.path.abspath(os.fspath(pte)),
            "ptd": None if ptd is None else os.path.abspath(os.fspath(ptd)),
            "out": str(work),
        }
        maker = _Child(work, "make")
        maker.run(
            {
                **base,
                "steps": [
                    {"name": "reference", "cache": None},
                    {"name": "made", "cache": str(tmp_file)},
                ],
            },
            artifact,
            "while making the packed-weight file",
            timeout,
        )
        if _report(work, "made")["loads_with_options"] < 1:
            raise ConfigurationError(
                f"{shim.path}: the shim saw no method load of {artifact}; the bindings' "
                "extension did not bind to it"
            )
        if not tmp_file.is_file() or tmp_file.stat().st_size == 0:
            raise PackedWeightsRefused(
                artifact, "the runtime persisted no packed weights (the graph cannot be cached)"
            )
        reference = _load_outputs(work / "reference.npz")
        diff = _differences(_load_outputs(work / "made.npz"), reference)
        if diff:
            raise PackedWeightsRefused(
                artifact, "outputs with the cache differ from a load without it: " + "; ".join(diff)
            )
        try:
            entries = _parse_file(tmp_file)
            check_names(entries, keys, str(tmp_file))
        except FormatError as exc:
            raise PackedWeightsRefused(
                artifact, f"the runtime wrote a file ptestore rejects: {exc}"
            ) from None
        digest = file_sha256(tmp_file)
        size = tmp_file.stat().st_size
        os.chmod(tmp_file, 0o444)
        checker = _Child(work, "reload")
        checker.run(
            {**base, "steps": [{"name": "reloaded", "cache": str(tmp_file)}]},
            artifact,
            "while loading with the finished file",
            timeout,
        )
        log = checker.stderr()
        if "seed mismatch" in log:
            raise PackedWeightsRefused(
                artifact, "the runtime repacked on reload (seed mismatch): the file is no use here"
            )
        if "Saved packed weight index" in maker.stderr() and (
            f"Loaded packed weight cache: {tmp_file} ({len(entries)} entries)" not in log
        ):
            raise PackedWeightsRefused(
                artifact, f"the runtime did not load the file's {len(entries)} entries on reload"
            )
        diff = _differences(_load_outputs(work / "reloaded.npz"), reference)
        if diff:
            raise PackedWeightsRefused(
                artifact,
                "outputs loaded with the file differ from a load without it: " + "; ".join(diff),
            )
        if tmp_file.stat().st_size != size or file_sha256(tmp_file) != digest:
            raise PackedWeightsRefused(artifact, "the runtime changed the file while loading it")
        fd = os.open(tmp_file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_file, path)
        stamp = _stamp(path.stat())
        record = {
            "format": RECORD_FORMAT,
            "file": path.name,
            "size": size,
            "sha256": digest,
            "entries": len(entries),
            "identity": identity.to_json(),
            "made_unix": int(time.time()),
            "stamp": stamp,
        }
        _publish_bytes(json.dumps(record, indent=1).encode(), record_path)
        _fsync_dir(directory)
    except OSError as exc:
        raise StorageError(f"{directory}: making the packed-weight file failed: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return CacheFile(path, record_path, size, digest, len(entries), identity, made=True)
