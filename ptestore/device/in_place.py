"""``ensure(in_place=True)``: the source itself is rewritten once; the cache keeps only a
manifest with the identity the file has afterwards. The in-place machinery (the
coordinator) is imported when an entry is made, never for a hit."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from ..errors import AlreadySpecialized, ConfigurationError, PteStoreError, StorageError
from ..storage.types import StorageURL
from .artifact import (
    Artifact,
    HeldProgress,
    artifact_of,
    hit_or_make,
    lookup,
    warn_unchanged,
)
from .keys import (
    backend_fingerprint,
    device_fingerprint,
    entry_key,
    identity_of,
    source_identity,
)
from .layout import CacheLayout
from .manifest import Manifest, is_disk_full

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..backends.compat import DeviceProfile
    from ..backends.registry import BackendLike
    from ..coordinator.report import Event

__all__ = ["ensure_in_place", "is_own_output"]


def ensure_in_place(
    layout: CacheLayout,
    src: str,
    ptd_src: str | None,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    max_bytes: int | None,
    provenance: bool = True,
    portable: str | None = None,
    progress: Callable[[Event], None] | None = None,
) -> Artifact:
    """The entry of ``src`` rewritten in place: a hit while the file's identity is the
    one its manifest recorded, else the file is specialized in place again, once: a
    file that is already a specialized output (its trailer says so, or the entry's
    manifest recorded it as rewritten) is never specialized again. Its trailer's record
    current (the same backends and versions, the same device, its content intact: a run
    killed before its manifest, a cleared cache) is adopted as the entry; any other
    needs ``portable``, the portable source, specialized into ``src``."""
    from ..journal import recover_if_local

    if ptd_src is not None:
        raise ConfigurationError(
            f"{src}: ensure(in_place=True) rewrites a .pte alone; a .pte/.ptd pair is "
            "cached as a copy (in_place=False)"
        )
    if not StorageURL.of(src).local:
        raise ConfigurationError(f"{src}: in-place specialization works on local files only")
    if portable is not None:
        _check_portable(src, portable)
    layout.create()
    key = entry_key(src, None, backends, device, True, provenance)
    recover_if_local(src)
    versions = backend_fingerprint(backends, layout)
    dev = device_fingerprint(device)

    def current() -> dict[str, Any]:
        return {"source": source_identity(src), "ptd": None, "backends": versions, "device": dev}

    # The callback's exception once the file is rewritten ("write", "publish"; from the
    # portable source, "publish" of the copy renamed over it) waits until it is recorded:
    # never a rewritten file the cache does not know of.
    after = frozenset({"publish"} if portable is not None else {"write", "publish"})
    relay = None if progress is None else HeldProgress(progress, after)
    made = hit_or_make(
        layout,
        key,
        max_bytes,
        lambda: lookup(layout, key, current(), in_place=True),
        lambda: _make(layout, key, src, backends, device, current, provenance, portable, relay),
        before_make=lambda: recover_if_local(src),
    )
    if relay is not None:
        relay.raise_held()
    return made


def _check_portable(src: str, portable: str) -> None:
    p = StorageURL.of(portable)
    if p.local and os.path.realpath(p.path) == os.path.realpath(StorageURL.of(src).path):
        raise ConfigurationError(
            f"{src}: portable= names the file rewritten in place itself; it must be the "
            "original (portable) .pte the file is to be made from"
        )


def _make(
    layout: CacheLayout,
    key: str,
    src: str,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    current: Callable[[], dict[str, Any]],
    provenance: bool = True,
    portable: str | None = None,
    progress: Callable[[Event], None] | None = None,
) -> Artifact:
    path = StorageURL.of(src).location
    if portable is not None:
        return _from_portable(
            layout, key, path, portable, backends, device, current, provenance, progress
        )
    from ..coordinator.respecialize import refuse_specialized_output
    from ..storage.loaders import LocalFileLoader

    def ours(exc: AlreadySpecialized) -> bool:
        """The refusal's record is what this call would make, the content intact."""
        record = exc.provenance
        return record is not None and is_own_output(path, record, current()["backends"], device)

    # The file this call rewrites (or adopts), held open: its manifest records the
    # identity of this very file (fstat), never of whatever the path names afterwards.
    try:
        held = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise StorageError(f"{path}: cannot open: {exc.strerror}") from exc

    try:
        loader = LocalFileLoader(path)
        try:
            refuse_specialized_output(loader, path)  # what its trailer says, first
        except AlreadySpecialized as exc:
            if not ours(exc):
                raise
            return _publish(layout, key, src, path, current, True, held)  # not yet recorded
        finally:
            loader.close()
        _refuse_recorded_output(layout, key, path, current())  # without a trailer
        from .._signals import deferred_signals

        # A Ctrl-C (SIGTERM, SIGHUP) held from the journal's commit is delivered once
        # the rewritten file is recorded: without a trailer, the manifest is what tells
        # the next call that the file is an output already. A file another call (with
        # another cache) rewrote while this one waited for its lock is adopted under
        # that lock, as a later call adopts it.
        with deferred_signals():
            report = _specialize_in_place(path, backends, device, provenance, progress, ours)
            specialized = True if report is None else report.specialized
            made = _publish(layout, key, src, path, current, specialized, held)
            if report is not None:  # served as it is, once recorded: said, never silent
                warn_unchanged(report, key)
            return made
    finally:
        os.close(held)


def _specialize_in_place(
    path: str,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    provenance: bool,
    progress: Callable[[Event], None] | None,
    adoptable: Callable[[AlreadySpecialized], bool],
) -> Any:
    """The in-place run (None: the file adopted under its lock, nothing run)."""
    from ..coordinator.inplace import specialize_or_adopt
    from ..coordinator.report import ENSURE_PTD, ptd_spelling
    from ..provenance.stamp import ProvenanceRequest

    try:
        with ptd_spelling(ENSURE_PTD):  # the run's .ptd hint in ensure's flags
            return specialize_or_adopt(
                path,
                adoptable,
                backends=backends,
                device=device,
                provenance=ProvenanceRequest() if provenance else False,
                event_tracer=progress,
                strict=False,  # an app's cache keeps what it was given when nothing applies
            )
    except (PteStoreError, OSError) as exc:
        from ..journal import ApplyFailed

        if is_disk_full(exc) and not isinstance(exc, ApplyFailed):  # before the commit
            raise StorageError(
                f"{path}: no space left on the file system for the in-place journal "
                f"(the replaced bytes and the new metadata) or the space its writes "
                f"need; the file is unchanged: {exc}",
                errno=exc.errno if isinstance(exc, OSError) else None,
            ) from exc
        raise  # an apply that failed says that its journal is committed, and what to do


def _refuse_recorded_output(layout: CacheLayout, key: str, path: str, now: dict[str, Any]) -> None:
    """The entry's manifest recorded this very file (the same identity) as rewritten in
    place, for other backends or another device (an upgrade): it is an output, with or
    without a trailer; refuse to specialize it again."""
    from ..errors import AlreadySpecialized
    from .keys import as_recorded
    from .layout import read_manifest
    from .manifest import as_json, recorded_fingerprint

    try:
        old = read_manifest(layout.manifest(key))
    except Exception:  # unreadable: nothing recorded
        return
    if not old or not old.get("in_place") or not old.get("specialized", True):
        return  # not an in-place entry, or one whose run changed nothing
    was = recorded_fingerprint(old) or {}  # ctime_ns where it was recorded
    want = as_recorded(as_json(now), was)  # an older manifest: compared without ctime
    if was.get("source") != want["source"]:
        return  # another file now (a new download): a portable model again
    changed = [
        f"{name} {'were' if name == 'backends' else 'was'} {was.get(name)}, now {want[name]}"
        for name in ("backends", "device")
        if was.get(name) != want[name]
    ]
    from ..coordinator.respecialize import PORTABLE_HINT

    raise AlreadySpecialized(
        f"{path}: already specialized in place (the cache's entry {key} records this "
        f"file, unchanged since, as rewritten by its backends; {'; '.join(changed) or 'as now'}"
        f"); specializing it again would apply the backends to their own output. "
        f"{PORTABLE_HINT}",
        path=path,
    )


def is_own_output(
    path: str,
    record: Any,
    backends: list[list[str]],
    device: DeviceProfile | None,
    *,
    made_from: str | None = None,
) -> bool:
    """Whether the file's own provenance ``record`` is exactly what this request would
    make, its content intact: the backends requested and their versions (``backends``:
    ``[spec, version]`` of each, as :func:`.keys.backend_versions` gives them; for the
    registry's backends, every one that ran installed at its version), the same device
    (name and option digest), and with ``made_from``, the source the record names (an
    in-place rerun: the file itself). ``ensure(in_place=True)`` adopts such a file as
    its entry, made by a run that did not get to record it; ``ptestore specialize M M
    --in-place`` has nothing to do."""
    from ..verification import verify

    if made_from is not None and record.source.url != made_from:
        return False
    want_backends = [list(b) for b in backends]
    if record.requested:
        have = [[b.spec, b.version] for b in record.requested]
        if have != want_backends:
            return False
    else:  # the registry's backends: every one that ran is installed at its version
        if not record.backends or any(
            [b.spec, b.version] not in want_backends for b in record.backends
        ):
            return False
    if (record.device is None) != (device is None):
        return False
    if device is not None and (record.device.name, record.device.digest) != (
        device.name,
        device.digest(),
    ):
        return False
    return verify(path).status == "intact"


def _from_portable(
    layout: CacheLayout,
    key: str,
    path: str,
    portable: str,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    current: Callable[[], dict[str, Any]],
    provenance: bool,
    progress: Callable[[Event], None] | None = None,
) -> Artifact:
    """The portable source specialized into ``path`` (a staged copy beside it, renamed
    over it: the output's size must be free), whatever ``path`` holds now. The staged
    copy is held open across the rename: the manifest records the identity of the file
    this call put at ``path`` (``fstat``), and a path that names another file by then
    is refused (:func:`_publish`), never recorded as specialized. The staged copy is
    named as the writers name their staging files (``.NAME.ptestore-<16 hex>.tmp``) and
    locked as theirs are while it is held: one a crash leaves between the publish and
    the rename is collected by ``ptestore gc``, one in use never is."""
    import fcntl

    from .. import coordinator
    from ..coordinator.report import ENSURE_PTD, ptd_spelling
    from ..provenance.stamp import ProvenanceRequest
    from ..storage.atomic import rename, temp_name
    from ..writers._staging import take_over

    staged = temp_name(path)
    try:
        with ptd_spelling(ENSURE_PTD):  # the run's .ptd hint in ensure's flags
            report = coordinator.specialize(
                portable,
                staged,
                backends=backends,
                device=device,
                provenance=ProvenanceRequest() if provenance else False,
                event_tracer=progress,
                strict=False,
            )
    except (PteStoreError, OSError) as exc:
        if is_disk_full(exc):
            raise StorageError(
                f"{path}: no space left on the file system for the specialized copy of "
                f"the portable source {portable} (it is written beside {path}, then renamed "
                f"over it); {path} is unchanged: {exc}"
            ) from exc
        raise
    try:
        held = os.open(staged, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(f"{staged}: cannot open the specialized copy: {exc.strerror}") from exc
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # gc leaves a locked one alone
    except OSError:
        pass  # a file system without flock: gc's age limit still protects a fresh copy
    try:
        # what a file replacing ``path`` keeps of it, as the local writer's publish
        take_over(held, path, None)  # its owner, its permission bits (docs/storage.md)
        rename(staged, path)
        made = _publish(layout, key, path, path, current, report.specialized, held)
        warn_unchanged(report, key)  # served as it is, once recorded: said, never silent
        return made
    finally:
        os.close(held)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)  # a rename that failed: the copy is not left beside it


def _publish(
    layout: CacheLayout,
    key: str,
    src: str,
    path: str,
    current: Callable[[], dict[str, Any]],
    specialized: bool,
    held: int | None = None,
) -> Artifact:
    """Record the entry. ``held``: a descriptor of the file the run rewrote; its
    identity is taken from it (``fstat``), and a path that names another file by now
    (replaced by an update meanwhile) is refused: that file was not specialized."""
    from ..provenance import read_provenance
    from ..storage.loaders import LocalFileLoader

    fingerprint = current()
    if held is not None:
        st = os.fstat(held)
        fingerprint["source"] = identity_of(path, st)
        try:
            there = os.stat(path)
        except OSError:
            there = None
        if there is None or (there.st_dev, there.st_ino) != (st.st_dev, st.st_ino):
            now = "gone" if there is None else f"inode {there.st_ino}"
            raise StorageError(
                f"{path}: replaced by another file while it was specialized in place (the "
                f"rewritten file is inode {st.st_ino}, the path now names {now}); the new "
                "file is not specialized and nothing was recorded: call ensure again"
            )
    loader = LocalFileLoader(path)
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    manifest = Manifest.of(
        key=key,
        source=path,
        fingerprint=fingerprint,
        files={},
        specialized=specialized,
        provenance=prov,
        in_place=True,
    )
    layout.make_entry_dir(key)
    manifest.publish(layout, src)
    return artifact_of(layout, manifest, True)
