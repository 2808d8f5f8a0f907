"""Make, bind, verify and find XNNPACK packed-weight files.

One file per identity (:mod:`.identity`) in a directory, beside it a record and a lock::

    <dir>/xnnpack-<id>.xpwc        the packed weights, read-only (0444)
    <dir>/xnnpack-<id>.xpwc.json   its record: identity, size, SHA-256, entries
    <dir>/xnnpack-<id>.xpwc.lock   flock of whoever makes it
    <dir>/xnnpack-<id>.refused.json  why the runtime cannot have one (made once)

:func:`make_cache` (under the lock): a verified file is returned as is; anything else
under the name (missing, corrupt, stale, half made by a killed maker) is removed and made
again. The ``.pte`` and ``.ptd`` are opened once (:mod:`.pinned`): hashed for the
identity, parsed and run by the children through those inodes, so the file is the
packed weights of the bytes its identity names. Making runs the stock runtime in a child
process twice: once loading every method without the cache (the reference) and then
with the cache at a private temporary path, and once more in a fresh child with the
finished file; the file must parse (footer, index in bounds, entry names made of the
artifact's XNNPACK keys) before any runtime is pointed at it, and every output of every
method must equal the reference bit for bit.
Only then is it published: fsync, 0444, rename into the directory, then the record the
same way (the record is what makes a file findable), through
:mod:`ptestore.storage.atomic`. :func:`find_cache` and :func:`verify_cache` hand a file
out only when its record (:mod:`.record`) names this identity and its size and SHA-256
match.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigurationError,
    FormatError,
    IntegrityError,
    PackedWeightsRefused,
    StorageError,
)
from ..storage.flock import locked
from .digests import artifact_digests, memo_of, remember, remember_quietly, remembered_in
from .identity import Identity, file_sha256
from .native import ExecutorchBuild, Shim, build_shim, executorch_build
from .pinned import PinnedArtifact
from .record import (
    RECORD_FORMAT,
    CacheFile,
    PathLike,
    check_file,
    found_checked,
    parse_file,
    paths,
    publish_file,
    read_record,
    remove_stale,
    stamp,
)
from .refusal import read_refusal, write_refusal
from .runs import ChildRun
from .workdirs import remove_abandoned
from .xpwc import check_coverage, check_names

if TYPE_CHECKING:
    from ..format.xnnpack import PackedWeight

__all__ = [
    "RECORD_FORMAT",
    "CacheFile",
    "artifact_keys",
    "artifact_weights",
    "find_cache",
    "make_cache",
    "verify_cache",
]


def artifact_keys(pte: PathLike) -> set[str]:
    """The named-data keys the XNNPACK delegate graphs of a .pte refer to."""
    return artifact_weights(pte)[0]


def artifact_weights(
    pte: PathLike, *, name: str | None = None
) -> tuple[set[str], list[PackedWeight]]:
    """The named-data keys the XNNPACK delegate graphs of a .pte refer to, and the
    weights they have XNNPACK pack at load time (each needs an entry in the file).
    ``name``: the file's name in errors (default: ``pte``)."""
    from ..format.reader import read_container
    from ..format.tensors import xnnpack_packed_weights, xnnpack_tensors
    from ..storage.loaders import LocalFileLoader

    loader = LocalFileLoader(os.fspath(pte))
    if name is not None:
        loader.name = name
    try:
        parsed = read_container(loader)
        keys = {key for key, _ in xnnpack_tensors(parsed, loader)}
        return keys, xnnpack_packed_weights(parsed, loader)
    finally:
        loader.close()


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
    (device, inode, size, mtime, ctime as recorded); any other file is hashed. So is the
    artifact's, taken from the record while the ``.pte`` and ``.ptd`` are unchanged
    since they were hashed for it (:mod:`.digests`)."""
    with PinnedArtifact(pte, ptd) as artifact:
        return verify_pinned(path, artifact, pte_sha256, ptd_sha256, full)


def verify_pinned(
    path: PathLike,
    artifact: PinnedArtifact,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    full: bool,
) -> CacheFile:
    """:func:`verify_cache` of the artifact held open (:mod:`.pinned`): its files are
    hashed through the inodes held (:func:`~ptestore.xnnpack.load` then hands the runtime
    the same ones)."""
    build = executorch_build()
    p = Path(path)
    record_path = p.with_name(p.name + ".json")
    try:
        record = read_record(record_path)
    except FileNotFoundError:
        raise IntegrityError(
            f"{p}: no record beside it ({record_path.name})", published=False
        ) from None
    memo = None if full else memo_of(record)
    digests = artifact_digests(
        artifact.pte, artifact.ptd, pte_sha256, ptd_sha256, memo, pinned=artifact
    )
    assert digests is not None  # hashed when not known
    verified = check_file(p, record, Identity.of(digests.pte, digests.ptd, build), full)
    remember_quietly(record_path, digests.learned)
    return verified


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
    again). With ``full=False`` the artifact's digests are taken from what the records
    in ``directory`` remember for its files as they are now (:mod:`.digests`), else
    hashed; then the only change on disk is the record of the file found remembering
    them."""
    build = executorch_build()
    directory = Path(directory)
    if not full:
        quick = _remembered(pte, ptd, directory, pte_sha256, ptd_sha256, build)
        if quick is not None:
            return quick
    digests = artifact_digests(pte, ptd, pte_sha256, ptd_sha256)
    assert digests is not None  # hashed when not known
    identity = Identity.of(digests.pte, digests.ptd, build)
    path, record_path, _, _ = paths(directory, identity)
    found = found_checked(path, record_path, identity, full)
    if found is not None:
        remember_quietly(record_path, digests.learned)
    return found


def _remembered(
    pte: PathLike,
    ptd: PathLike | None,
    directory: Path,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    build: ExecutorchBuild,
) -> CacheFile | None:
    """The file for the runtime ``build`` found through the artifact digests the records
    in ``directory`` remember for its files as they are now (``full=False`` checks);
    each identity tried once. None at once when the caller gave every digest."""
    if pte_sha256 is not None and (ptd is None or ptd_sha256 is not None):
        return None  # nothing to look up: the caller's check is the one that follows
    tried: set[str] = set()
    for known in remembered_in(directory, pte, ptd, pte_sha256, ptd_sha256):
        identity = Identity.of(known.pte, known.ptd, build)
        if identity.name in tried:
            continue
        tried.add(identity.name)
        path, record_path, _, _ = paths(directory, identity)
        found = found_checked(path, record_path, identity, full=False)
        if found is not None:
            return found
    return None


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
    anything (``retry_refused=True`` tries again), unless it may pass (``transient``: a
    timeout, a kill from outside, a SIGBUS, an exit without the child's reason; see
    :mod:`.refusal`). ``timeout``: seconds for each child (None: no limit);
    ``full``: as for :func:`verify_cache`, for a file found. An artifact written in
    place while it was made (or before a child failed), or not of the digests given, is
    :class:`IntegrityError` (nothing published, nothing remembered as a refusal)."""
    started = time.perf_counter()
    shim = build_shim()
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    if not full:
        quick = _remembered(pte, ptd, directory, pte_sha256, ptd_sha256, shim.build)
        if quick is not None:
            return quick
    # Opened once: hashed, parsed and run through these inodes (see .pinned), so the
    # file made is the packed weights of the bytes its identity names.
    with PinnedArtifact(pte, ptd) as pinned:
        return _found_or_made(
            pinned, pte_sha256, ptd_sha256, directory, shim, timeout, retry_refused, full, started
        )


def _found_or_made(
    pinned: PinnedArtifact,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    directory: Path,
    shim: Shim,
    timeout: float | None,
    retry_refused: bool,
    full: bool,
    started: float,
) -> CacheFile:
    pte, ptd = pinned.pte, pinned.ptd
    digests = artifact_digests(pte, ptd, pte_sha256, ptd_sha256, pinned=pinned)
    assert digests is not None  # hashed when not known
    identity = Identity.of(digests.pte, digests.ptd, shim.build)
    path, record_path, lock_path, refused_path = paths(directory, identity)
    artifact = pte if ptd is None else f"{pte} (+ {ptd})"
    with locked(lock_path):
        found = found_checked(path, record_path, identity, full)
        if found is not None:
            if digests.learned:
                remember(record_path, digests.learned)
            return found
        reason = None if retry_refused else read_refusal(refused_path)
        if reason is not None:
            raise PackedWeightsRefused(artifact, f"{reason} (refused before)")
        if pte_sha256 is not None or ptd_sha256 is not None:
            from .digests import check_given  # making costs far more than hashing

            check_given(pinned, digests)
        remove_stale(directory, identity)
        remove_abandoned(directory, identity.name)  # killed makers' of other identities
        try:
            made = _make(pinned, shim, identity, directory, artifact, timeout, digests.learned)
        except PackedWeightsRefused as exc:
            # a child's failure on bytes written meanwhile: IntegrityError, no refusal
            pinned.check_unchanged(identity.pte_sha256, identity.ptd_sha256, cause=exc)
            if not exc.transient:  # one that may pass is tried again next time
                write_refusal(refused_path, identity, exc)
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
    pinned: PinnedArtifact,
    shim: Shim,
    identity: Identity,
    directory: Path,
    artifact: str,
    timeout: float | None,
    learned: dict[str, Any],
) -> CacheFile:
    keys, weights = artifact_weights(pinned.pte_path, name=pinned.pte)
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
            # the inodes hashed for the identity, inherited by the child (pass_fds)
            "pte": pinned.pte_path,
            "ptd": pinned.ptd_path,
            "out": str(work),
        }
        maker = ChildRun(work, "make")
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
            made=(tmp_file,),
            pass_fds=pinned.fds,
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
            entries = parse_file(tmp_file)
            check_names(entries, keys, str(tmp_file))
            check_coverage(entries, weights, str(tmp_file))
        except FormatError as exc:
            raise PackedWeightsRefused(
                artifact, f"the runtime wrote a file ptestore rejects: {exc}"
            ) from None
        digest = file_sha256(tmp_file)
        size = tmp_file.stat().st_size
        os.chmod(tmp_file, 0o444)
        before = stamp(tmp_file.stat())
        checker = ChildRun(work, "reload")
        checker.run(
            {**base, "steps": [{"name": "reloaded", "cache": str(tmp_file)}]},
            artifact,
            "while loading with the finished file",
            timeout,
            pass_fds=pinned.fds,
        )
        # Loaded from the file: the child saw it mapped while its methods lived, and
        # nothing rewrote it (a repack into it truncates it first).
        if _report(work, "reloaded").get("cache_mapped") is not True:
            raise PackedWeightsRefused(
                artifact, "the runtime did not load the finished file on reload (not mapped)"
            )
        if stamp(tmp_file.stat()) != before:
            raise PackedWeightsRefused(artifact, "the runtime rewrote the file on reload")
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
        pinned.check_unchanged(identity.pte_sha256, identity.ptd_sha256)
        # The large file is published as the runtime wrote it (0444 already).
        made = publish_file(tmp_file, directory, identity, size, digest, len(entries), learned)
    except StorageError:
        raise  # from ptestore.storage.atomic: it names the file and the step
    except OSError as exc:
        raise StorageError(f"{directory}: making the packed-weight file failed: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return made
