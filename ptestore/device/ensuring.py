"""``ensure(source, cache_dir=...)``: the one call an app makes on the device.

The first call specializes the model into the cache; later calls return the cached
artifact after a few ``stat`` calls and one small read (the entry's manifest), without
reading the source. See docs/device.md.

The **key** of an entry (its directory name) is the SHA-256 of the source's location
(the local path with symlinks resolved, or the URL), the ``.ptd``'s, the backend specs
as given, the device name and whether the run is in place. The entry's manifest records
the **fingerprint** it was made for: the source's identity (local: device, inode, size,
``mtime_ns``; remote: size, ETag and version id, or its SHA-256 when the store gives
neither), the backend specs with the versions of their implementations, and the device
name and digest. A call whose fingerprint differs finds that entry stale and
specializes it again, in place of the old one; nothing else is touched.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..backends.compat import DeviceProfile, canonical_json
from ..errors import (
    ConfigurationError,
    ObjectNotFound,
    PteStoreError,
    StorageError,
)
from .cache import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    CacheLayout,
    clean_entry_locked,
    evict,
    file_stamp,
    files_intact,
    read_manifest,
    touch,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..backends.registry import BackendLike
    from ..provenance.record import Provenance

__all__ = ["Artifact", "ensure", "entry_key", "source_identity"]

PathOrUrl = str | os.PathLike[str]

PTE_NAME = "model.pte"
PTD_NAME = "model.ptd"


@dataclass(frozen=True)
class Artifact:
    """What :func:`ensure` returns: where the specialized model is and how it was made."""

    #: Path of the specialized ``.pte``.
    pte: str
    #: Path of its ``.ptd`` (None without one).
    ptd: str | None
    #: The provenance record of the ``.pte`` (sources, backends, device); None when it
    #: was made with ``provenance=False``.
    provenance: Provenance | None
    #: True when this call made it, False when it came from the cache.
    created: bool
    #: The cache key (the entry's directory name under ``CACHE_DIR/entries``).
    key: str
    #: Whether a backend specialized anything (False: an unchanged copy).
    specialized: bool = True
    #: True when the source itself was rewritten (``in_place=True``).
    in_place: bool = False
    #: For a source that is a job index (``model=``): what :func:`ptestore.select` chose
    #: and why (``Choice.to_dict()``: ``kind`` ``"artifact"`` or ``"source"``, ``reason``).
    choice: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "pte": self.pte,
            "ptd": self.ptd,
            "created": self.created,
            "key": self.key,
            "specialized": self.specialized,
            "in_place": self.in_place,
            "provenance": None if self.provenance is None else self.provenance.to_dict(),
        }
        if self.choice is not None:
            out["choice"] = self.choice
        return out


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> str:
    return os.path.realpath(url.removeprefix("file://"))


def source_identity(url: str) -> dict[str, Any]:
    """The identity of the object at ``url``: for a local file one ``stat``; for a remote
    object its size, ETag and version id (one metadata request), or its SHA-256 when the
    store reports neither."""
    if _is_local(url):
        path = _local_path(url)
        try:
            st = os.stat(path)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{url}: no such file") from exc
        except OSError as exc:
            raise StorageError(f"{url}: cannot stat: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ConfigurationError(f"{url}: not a regular file")
        return {
            "path": path,
            "dev": st.st_dev,
            "ino": st.st_ino,
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
        }
    from ..storage.loaders import open_loader

    loader = open_loader(url)
    try:
        etag = getattr(loader, "etag", None)
        version = getattr(loader, "version_id", None)
        ident: dict[str, Any] = {"url": url, "size": loader.size(), "etag": etag}
        ident["version_id"] = version
        if etag is None and version is None:
            from ..provenance.stamp import describe_source

            ident["sha256"] = describe_source(loader).sha256
        return ident
    finally:
        loader.close()


def _location(url: str) -> str:
    return _local_path(url) if _is_local(url) else url


def spec_text(backend: BackendLike) -> str:
    """How a backend is named in keys and provenance (as
    :func:`ptestore.provenance.stamp.spec_text`, without importing the storage layer)."""
    if isinstance(backend, str):
        return backend.strip()
    cls = backend if isinstance(backend, type) else type(backend)
    return f"{cls.__module__}:{cls.__qualname__}"


#: Versions of backends given as SPEC strings (and of the installed set), read once per
#: process: resolving a registered name scans every installed distribution's entry
#: points (tens of ms), and an implementation's module, once imported, stays what it is
#: for the life of the process.
_SPEC_VERSIONS: dict[str, str] = {}
_INSTALLED: list[list[str]] | None = None
#: Whether this process has consulted a cache's snapshot of the installed metadata
#: (only its first ``ensure`` needs one: later ones have the caches above).
_SNAPSHOT_USED = False


def _backend_fingerprint(
    backends: list[BackendLike] | None, layout: CacheLayout
) -> list[list[str]]:
    """``[spec, version]`` of every backend; the installed distributions' metadata
    (entry points, distribution versions) is read through the cache's snapshot
    (:mod:`ptestore.backends.snapshot`), so a fresh process whose installation is
    unchanged does not read it again."""
    global _SNAPSHOT_USED
    if _SNAPSHOT_USED:  # later calls: this process's own caches (below and in compat)
        return _backend_versions(backends)
    _SNAPSHOT_USED = True
    from ..backends.snapshot import using

    with using(layout.snapshot):
        return _backend_versions(backends)


def _backend_versions(backends: list[BackendLike] | None) -> list[list[str]]:
    global _INSTALLED
    from ..backends.registry import installed_backends, load_backend

    if backends is None:
        if _INSTALLED is None:
            out = []
            for inst in installed_backends():
                if inst.error is not None:
                    continue
                try:
                    version = str(load_backend(inst.name).version)
                except PteStoreError:  # one that needs an argument (command) is not a default
                    version = inst.version or ""
                out.append([inst.name, version])
            _INSTALLED = out
        return [list(x) for x in _INSTALLED]
    result = []
    for b in backends:
        spec = spec_text(b)
        if isinstance(b, str):
            if spec not in _SPEC_VERSIONS:
                _SPEC_VERSIONS[spec] = str(load_backend(b).version)
            version = _SPEC_VERSIONS[spec]
        else:
            version = str(load_backend(b).version)
        result.append([spec, version])
    return result


def entry_key(
    source: str,
    ptd: str | None,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    in_place: bool,
    provenance: bool = True,
) -> str:
    """The cache key: the entry's directory name (32 hex digits). An entry made without
    provenance has a key of its own (its bytes differ: no trailer)."""

    material: list[Any] = [
        "ptestore.ensure/1",
        _location(source),
        None if ptd is None else _location(ptd),
        None if backends is None else [spec_text(b) for b in backends],
        None if device is None else device.name,
        bool(in_place),
    ]
    if not provenance:  # appended only when off: the keys of existing entries stay
        material.append("no-provenance")
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()[:32]


def _check_args(max_bytes: int | None, device: DeviceProfile | None) -> None:
    if max_bytes is not None and (
        not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0
    ):
        raise ConfigurationError(f"max_bytes must be an integer >= 0 or None, got {max_bytes!r}")
    if device is not None and not isinstance(device, DeviceProfile):
        raise ConfigurationError(
            f"device must be a DeviceProfile or None, got {type(device).__name__}"
        )


def _check_index_args(
    src: str, model: str | None, ptd: str | None, in_place: bool, provenance: bool
) -> None:
    if model is None:
        raise ConfigurationError(
            f"{src}: a job index needs model= (CLI: --model NAME) and device= (--device NAME)"
        )
    if not src.endswith(".json"):
        raise ConfigurationError(
            f"{src}: model={model!r} names a model of a job index (a .json such as "
            "ptestore-index.json); this source is not one"
        )
    if ptd is not None:
        raise ConfigurationError(f"{src}: ptd= does not apply to an index (it names the .ptd)")
    if in_place:
        raise ConfigurationError(f"{src}: in_place=True does not apply to an index")
    if not provenance:
        raise ConfigurationError(
            f"{src}: provenance=False does not apply to an index: its artifacts carry the "
            "trailers the index names (and the download is checked against them)"
        )


def ensure(
    source: PathOrUrl,
    *,
    cache_dir: PathOrUrl,
    backends: Iterable[BackendLike] | None = None,
    device: DeviceProfile | None = None,
    ptd: PathOrUrl | None = None,
    max_bytes: int | None = None,
    in_place: bool = False,
    provenance: bool = True,
    model: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Artifact:
    """The specialized model for ``source`` on this device, made once and cached.

    Args:
        source: the ``.pte``: a local path or a URL; or, with ``model``, a fleet job's
            index (``ptestore-index.json``, a path or URL): then the artifact
            :func:`ptestore.select` picks for ``device`` is downloaded (verified, as
            :func:`ptestore.fetch` does) and cached while the index names it; when none
            fits, the model's portable source is specialized here with ``backends``
            (see docs/device.md).
        cache_dir: a local directory for the cache (created if missing).
        backends: as for :func:`ptestore.specialize` (None: every installed backend
            whose name is a backend id of the program).
        device: the device profile handed to the backends.
        ptd: the model's external weights (``.ptd``), if any.
        max_bytes: after making an entry, evict least-recently-used entries until the
            cache holds at most this many bytes (never the entry returned, never one
            another process holds).
        in_place: rewrite ``source`` itself instead of making a copy in the cache (local
            files only; the cache then keeps only the manifest).
        provenance: end the artifact with a provenance trailer (the default), what
            lets ``ptestore verify`` and the fleet tell it current or stale; False
            writes none (CLI: ``--no-provenance``; such an entry has a key of its own).
            A source that nothing changes, rewritten in place, is still left as it was.
        model: the model's name in the index ``source`` (only with an index).
        storage_options: fsspec/s3fs options for the index and the files it names
            (only with an index).

    Returns:
        An :class:`Artifact`: paths of the ``.pte`` and ``.ptd``, the provenance,
        whether this call made it (and with an index, what was chosen and why).

    Raises:
        StorageError: the cache's file system is full (the cache and the source are left
            as they were) or another I/O failure.
        IntegrityError: with an index, a download that does not match it (the cache
            is left as it was).
        ConfigurationError, ObjectNotFound, FormatError, BackendError: as for
            :func:`ptestore.specialize`.
    """
    _check_args(max_bytes, device)
    if not isinstance(provenance, bool):
        raise ConfigurationError(f"provenance must be True or False, got {provenance!r}")
    src = os.fspath(source)
    ptd_src = None if ptd is None else os.fspath(ptd)
    blist = None if backends is None else list(backends)
    if model is not None or src.endswith(".json"):
        _check_index_args(src, model, ptd_src, in_place, provenance)
        assert model is not None
        return _ensure_from_index(
            src, cache_dir, model, device, blist, max_bytes, dict(storage_options or {})
        )
    if storage_options:
        raise ConfigurationError(
            f"{src}: storage_options apply to a job index (with model=), not to a .pte"
        )
    if in_place:
        return _ensure_in_place(
            CacheLayout(cache_dir), src, ptd_src, blist, device, max_bytes, provenance
        )
    from ..journal import recover_if_local

    recover_if_local(src)  # an interrupted in-place run of the source: finish it first
    layout = CacheLayout(cache_dir)
    layout.create()
    key = entry_key(src, ptd_src, blist, device, False, provenance)
    fingerprint = {
        "source": source_identity(src),
        "ptd": None if ptd_src is None else source_identity(ptd_src),
        "backends": _backend_fingerprint(blist, layout),
        "device": None if device is None else [device.name, device.digest()],
    }
    return _hit_or_make(
        layout,
        key,
        max_bytes,
        lambda: _lookup(layout, key, fingerprint),
        lambda: _make(layout, key, fingerprint, src, ptd_src, blist, device, provenance),
    )


def _hit_or_make(
    layout: CacheLayout,
    key: str,
    max_bytes: int | None,
    lookup: Callable[[], Artifact | None],
    make: Callable[[], Artifact],
    before_make: Callable[[], None] | None = None,
) -> Artifact:
    """The entry ``key``: ``lookup()`` under the key's shared lock (a hit), else under its
    exclusive lock ``lookup()`` again (another process may have made it) and ``make()``;
    a made entry then evicts others down to ``max_bytes``."""
    with layout.lock(key, shared=True):
        hit = lookup()
    if hit is not None:
        return hit
    with layout.lock(key):
        if before_make is not None:
            before_make()
        hit = lookup()
        if hit is None:
            hit = make()
    if max_bytes is not None:
        evict(layout.root, max_bytes, keep=key)
    return hit


def _ensure_from_index(
    index: str,
    cache_dir: PathOrUrl,
    model: str,
    device: DeviceProfile | None,
    backends: list[BackendLike] | None,
    max_bytes: int | None,
    opts: dict[str, Any],
) -> Artifact:
    """``ensure(index, model=...)`` (see :mod:`ptestore.device.indexed`): the artifact the
    index selects, fetched into the entry keyed on the index, the model and the device,
    current while the index still selects the same files; else the portable source,
    specialized here."""
    from .indexed import choose, fetch_entry, index_fingerprint, index_key

    choice = choose(index, model, device, opts)
    assert device is not None  # choose refuses None
    if choice.kind == "source":
        made = ensure(
            choice.pte["url"],
            cache_dir=cache_dir,
            backends=backends,
            device=device,
            ptd=None if choice.ptd is None else choice.ptd["url"],
            max_bytes=max_bytes,
        )
        return dataclasses.replace(made, choice=choice.to_dict())
    layout = CacheLayout(cache_dir)
    layout.create()
    key = index_key(index, model, device)
    fingerprint = index_fingerprint(index, model, device, choice)

    def fetched() -> Artifact:
        os.makedirs(layout.entry_dir(key), exist_ok=True)
        manifest = fetch_entry(layout, key, index, model, device, opts, (PTE_NAME, PTD_NAME))
        write_manifest(layout, key, manifest, index)
        clean_entry_locked(layout, key, manifest)  # the previous files' leftovers
        return _artifact(layout, key, manifest, True)

    return _hit_or_make(layout, key, max_bytes, lambda: _lookup(layout, key, fingerprint), fetched)


def _ensure_in_place(
    layout: CacheLayout,
    src: str,
    ptd_src: str | None,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    max_bytes: int | None,
    provenance: bool = True,
) -> Artifact:
    """``ensure(in_place=True)``: the source itself is rewritten once; the cache keeps
    only a manifest with the identity the file has afterwards."""
    from ..journal import recover_if_local

    if ptd_src is not None:
        raise ConfigurationError(
            f"{src}: ensure(in_place=True) rewrites a .pte alone; a .pte/.ptd pair is "
            "cached as a copy (in_place=False)"
        )
    if not _is_local(src):
        raise ConfigurationError(f"{src}: in-place specialization works on local files only")
    layout.create()
    key = entry_key(src, None, backends, device, True, provenance)
    recover_if_local(src)
    versions = _backend_fingerprint(backends, layout)
    dev = None if device is None else [device.name, device.digest()]

    def current() -> dict[str, Any]:
        return {"source": source_identity(src), "ptd": None, "backends": versions, "device": dev}

    return _hit_or_make(
        layout,
        key,
        max_bytes,
        lambda: _lookup_in_place(layout, key, current()),
        lambda: _make_in_place(layout, key, src, backends, device, current, provenance),
        before_make=lambda: recover_if_local(src),
    )


def _lookup_in_place(layout: CacheLayout, key: str, fingerprint: dict[str, Any]) -> Artifact | None:
    path = layout.manifest(key)
    try:
        manifest = read_manifest(path)
    except Exception:
        return None
    if manifest is None or manifest.get("fingerprint") != _jsonish(fingerprint):
        return None
    touch(path)
    return _in_place_artifact(key, manifest, False)


def _in_place_artifact(key: str, manifest: dict[str, Any], created: bool) -> Artifact:
    from ..provenance.record import Provenance

    record = manifest.get("provenance")
    return Artifact(
        pte=manifest["source"],
        ptd=None,
        provenance=None if record is None else Provenance.from_dict(record, manifest["source"]),
        created=created,
        key=key,
        specialized=bool(manifest.get("specialized", True)),
        in_place=True,
    )


def _make_in_place(
    layout: CacheLayout,
    key: str,
    src: str,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    current: Any,
    provenance: bool = True,
) -> Artifact:
    from ..coordinator.inplace import specialize_in_place
    from ..provenance import read_provenance
    from ..provenance.stamp import ProvenanceRequest
    from ..storage.loaders import LocalFileLoader

    path = _local_path(src)
    try:
        report = specialize_in_place(
            path,
            backends=backends,
            device=device,
            provenance=ProvenanceRequest() if provenance else False,
            strict=False,  # an app's cache keeps what it was given when nothing applies
        )
    except (PteStoreError, OSError) as exc:
        if _enospc(exc):
            raise StorageError(
                f"{path}: no space left on the file system for the in-place journal "
                f"(the replaced bytes and the new metadata); the file is unchanged: {exc}"
            ) from exc
        raise
    loader = LocalFileLoader(path)
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "key": key,
        "source": path,
        "ptd_source": None,
        "fingerprint": _jsonish(current()),
        "files": {},
        "specialized": report.specialized,
        "in_place": True,
        "provenance": None if prov is None else prov.to_dict(),
    }
    os.makedirs(layout.entry_dir(key), exist_ok=True)
    write_manifest(layout, key, manifest, src)
    return _in_place_artifact(key, manifest, True)


def _artifact(layout: CacheLayout, key: str, manifest: dict[str, Any], created: bool) -> Artifact:
    from ..provenance.record import Provenance

    directory = layout.entry_dir(key)
    files = manifest["files"]
    record = manifest.get("provenance")
    prov = None if record is None else Provenance.from_dict(record, layout.manifest(key))
    choice = manifest.get("choice")
    return Artifact(
        pte=os.path.join(directory, files["pte"]["name"]),
        ptd=os.path.join(directory, files["ptd"]["name"]) if "ptd" in files else None,
        provenance=prov,
        created=created,
        key=key,
        specialized=bool(manifest.get("specialized", True)),
        choice=choice if isinstance(choice, dict) else None,
    )


def _lookup(layout: CacheLayout, key: str, fingerprint: dict[str, Any]) -> Artifact | None:
    path = layout.manifest(key)
    try:
        manifest = read_manifest(path)
    except Exception:  # unreadable or foreign: a miss, made again under the lock
        return None
    if manifest is None or manifest.get("fingerprint") != _jsonish(fingerprint):
        return None
    if not files_intact(layout.entry_dir(key), manifest):
        return None
    touch(path)
    return _artifact(layout, key, manifest, False)


def _jsonish(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _enospc(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def disk_full_error(where: str, src: str, need: int, exc: BaseException) -> StorageError:
    try:
        st = os.statvfs(where)
        free = f"{st.f_bavail * st.f_frsize} bytes free"
    except OSError:
        free = "free space unknown"
    return StorageError(
        f"{where}: no space left on the file system for the specialized copy of {src} "
        f"(about {need} bytes needed, {free}); the cache and the source are unchanged. "
        "Free space (`ptestore cache prune --max-bytes N`) or specialize in place "
        f"(--in-place): {exc}"
    )


def _make(
    layout: CacheLayout,
    key: str,
    fingerprint: dict[str, Any],
    src: str,
    ptd_src: str | None,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    provenance: bool = True,
) -> Artifact:
    from ..coordinator import specialize
    from ..provenance.stamp import ProvenanceRequest

    directory = layout.entry_dir(key)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full_error(layout.root, src, 0, exc) from exc
        raise StorageError(f"{directory}: cannot create: {exc.strerror}") from exc
    try:
        old = read_manifest(layout.manifest(key))
    except Exception:
        old = None
    clean_entry_locked(layout, key, old)  # leftovers of a run that died here
    pte = os.path.join(directory, PTE_NAME)
    ptd_dst = None if ptd_src is None else os.path.join(directory, PTD_NAME)
    try:
        report = specialize(
            src,
            pte,
            ptd=None if ptd_src is None or ptd_dst is None else (ptd_src, ptd_dst),
            backends=backends,
            device=device,
            provenance=ProvenanceRequest() if provenance else False,
            strict=False,
        )
    except (PteStoreError, OSError) as exc:  # a backend's spool write too
        if _enospc(exc):
            need = fingerprint["source"].get("size", 0) + (
                fingerprint["ptd"].get("size", 0) if fingerprint["ptd"] else 0
            )
            raise disk_full_error(layout.root, src, need, exc) from exc
        raise
    from ..provenance import read_provenance
    from ..storage.loaders import LocalFileLoader

    loader = LocalFileLoader(pte)
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    files = {"pte": {"name": PTE_NAME, **file_stamp(pte)}}
    if ptd_dst is not None:
        files["ptd"] = {"name": PTD_NAME, **file_stamp(ptd_dst)}
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "key": key,
        "source": _location(src),
        "ptd_source": None if ptd_src is None else _location(ptd_src),
        "fingerprint": _jsonish(fingerprint),
        "files": files,
        "specialized": report.specialized,
        "in_place": False,
        "provenance": None if prov is None else prov.to_dict(),
    }
    write_manifest(layout, key, manifest, src)
    return _artifact(layout, key, manifest, True)


def write_manifest(layout: CacheLayout, key: str, manifest: dict[str, Any], src: str) -> None:
    """Publish the manifest of entry ``key`` atomically (temp file, fsync, rename)."""
    from ..writers.local import LocalFileWriter

    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    try:
        writer = LocalFileWriter(layout.manifest(key))
        try:
            writer.write(data, 0)
            writer.publish()
        finally:
            writer.discard()
    except (StorageError, OSError) as exc:
        if _enospc(exc):
            raise disk_full_error(layout.root, src, len(data), exc) from exc
        raise
