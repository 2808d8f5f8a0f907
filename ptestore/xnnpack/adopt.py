"""A packed-weight file made elsewhere (by a fleet's worker with this CPU and this
ExecuTorch build) installed as this machine's file for an artifact.

:func:`adopt_cache` checks the file before anything could hand it out: the identity it
was made for is this artifact's, this runtime's and this CPU's (a file for another one is
refused, naming the fields that differ); its size and SHA-256 are the ones its maker
recorded; its index parses (footer, bounds, alignment, no overlap), names only the
artifact's XNNPACK keys and has an entry for every weight XNNPACK packs. Only then is it
published in ``directory`` under the maker's lock exactly as
:func:`~ptestore.xnnpack.make_cache` publishes a file it made (read-only, fsync, rename,
then the record), so :func:`~ptestore.xnnpack.find_cache` and
:func:`~ptestore.xnnpack.verify_cache` treat it as any other. A verified file already
there is kept (the offered one is removed).

What it does not check is what only the runtime can: a file made here is also loaded by
the runtime in a child process and its outputs compared with a load without it; an
adopted one is not run here. Its bytes are the maker's (the SHA-256 its maker recorded,
which the fleet's index names), and the fleet's maker ran those checks on a machine with
this CPU and build; but XNNPACK reads each packed weight at the size its kernels expect,
which no entry records (the runtime checks an entry's bounds, not its size), so a file
forged with matching digests (by whoever can write the index and the store) can make the
runtime read out of bounds and crash the process that loads it. That is the trust the
artifact from the same index already needs (a forged ``.pte`` runs in that process too):
adopt files from where the artifact comes from, and make one here
(:func:`~ptestore.xnnpack.make_cache`) for anything less trusted.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from ..errors import FormatError, IntegrityError
from ..storage.flock import locked
from .digests import artifact_digests, remember
from .identity import Identity, file_sha256
from .native import executorch_build
from .pinned import PinnedArtifact
from .record import (
    CacheFile,
    PathLike,
    found_checked,
    parse_file,
    paths,
    publish_file,
    read_record,
    remove_stale,
)
from .users import add_user, users_of
from .xpwc import check_coverage, check_names

__all__ = ["adopt_cache"]


def adopt_cache(
    file: PathLike,
    *,
    pte: PathLike,
    ptd: PathLike | None = None,
    directory: PathLike,
    made_for: dict[str, Any],
    size: int,
    sha256: str,
    pte_sha256: str | None = None,
    ptd_sha256: str | None = None,
    what: str | None = None,
    hashed: bool = False,
    installed_for: str | None = None,
) -> CacheFile:
    """Install ``file`` (in ``directory``, on the same file system) as the packed-weight
    file of ``pte`` (with ``ptd``) for this runtime and CPU, after the checks of the
    module's description; ``made_for`` is the identity its maker recorded
    (:meth:`~ptestore.xnnpack.Identity.to_json`), ``size`` and ``sha256`` (hex) its
    recorded size and digest. ``what`` names the file in errors (default: its path).
    ``hashed``: ``sha256`` is the digest the caller computed of these very bytes (a
    download hashed as it arrived, or assembled from verified chunks and hashed whole,
    :func:`ptestore.fleet.packed_chunks.download_delta`) and checked against the one
    recorded, so the file is not read again for it; never a recorded digest taken on
    trust (nothing ties a chunk record's root to the whole file's digest).
    ``installed_for``: the ``.pte``'s absolute path, named in the file's record (see
    :mod:`.users`: a newer file installed for it later removes this one).

    Raises :class:`IntegrityError` (the file is removed) when a check fails. The runtime
    does not load it here: see the module's description for what that leaves to trust."""
    tmp = Path(file)
    directory = Path(directory).absolute()
    # the keys checked are those of the bytes hashed for the identity (.pinned)
    with PinnedArtifact(pte, ptd) as artifact:
        return _adopt(
            tmp,
            artifact,
            directory,
            made_for,
            size,
            sha256,
            pte_sha256,
            ptd_sha256,
            what or str(tmp),
            hashed,
            installed_for,
        )


def _adopt(
    tmp: Path,
    artifact: PinnedArtifact,
    directory: Path,
    made_for: dict[str, Any],
    size: int,
    sha256: str,
    pte_sha256: str | None,
    ptd_sha256: str | None,
    name: str,
    hashed: bool,
    installed_for: str | None,
) -> CacheFile:
    from .cache import artifact_weights

    pte, ptd = artifact.pte, artifact.ptd
    digests = artifact_digests(pte, ptd, pte_sha256, ptd_sha256, pinned=artifact)
    assert digests is not None  # hashed when not given
    identity = Identity.of(digests.pte, digests.ptd, executorch_build())

    def refuse(message: str) -> IntegrityError:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        return IntegrityError(f"{name}: {message}", published=False)

    diff = identity.differences(made_for)
    if diff:
        raise refuse(f"made for another artifact, runtime or CPU ({'; '.join(diff)})")
    have = tmp.stat().st_size
    if have != size:
        raise refuse(f"{have} bytes, its maker recorded {size}")
    digest = sha256 if hashed else file_sha256(tmp)
    if digest != sha256:
        raise refuse(f"SHA-256 {digest}, its maker recorded {sha256}")
    keys, weights = artifact_weights(artifact.pte_path, name=pte)
    try:
        entries = parse_file(tmp)
        check_names(entries, keys, name)
        check_coverage(entries, weights, name)
    except FormatError as exc:
        raise refuse(f"not a packed-weight file for {pte}: {exc}") from None
    path, record_path, lock_path, _ = paths(directory, identity)
    # Read-only only under the lock, just before it is published: a process killed while
    # it waits for the lock leaves its download writable, so the next one resumes it.
    with locked(lock_path):
        found = found_checked(path, record_path, identity)
        # A file already there that names no user was made here (or installed by an
        # older ptestore): it stays one no update removes (see .users).
        installed = found is None or bool(users_of(read_record(record_path)))
        if found is not None:
            tmp.unlink()
            if digests.learned:
                remember(record_path, digests.learned)
        else:
            remove_stale(directory, identity)
            os.chmod(tmp, 0o444)
            found = publish_file(
                tmp, directory, identity, size, digest, len(entries), digests.learned
            )
        if installed_for is not None and installed:
            add_user(record_path, installed_for)
        return found
