"""What names a cache entry and what it was made for: the key and the fingerprint.

The **key** of an entry (its directory name) is the SHA-256 of the source's identity
(:func:`identity`: the local path with symlinks resolved, or the URL without its
credentials: no user information, no presigned query's signature, credential, token,
date or expiry; :func:`~ptestore.storage.types.url_identity`), the ``.ptd``'s, the
backend specs as given, the device name and whether the run is in place: one object
reached through presigned URLs whose signature rotates is one entry. The
**fingerprint** an entry's manifest records is the source's identity
(:func:`source_identity`: what tells a changed object, its size, ETag and version),
the backend specs with the versions of their implementations
(:func:`backend_fingerprint`) and the device name and digest. A call whose fingerprint
differs finds the entry stale. What a manifest records of a URL
(:func:`location`) is the URL as shown
(:func:`~ptestore.storage.types.redacted_url`): no password, no signature.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import TYPE_CHECKING, Any

from ..backends.compat import DeviceProfile, canonical_json, version_of
from ..backends.guard import guarded
from ..errors import ConfigurationError, ObjectNotFound, PteStoreError, StorageError
from ..storage.types import StorageURL, redacted_url, url_identity

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..backends.registry import BackendLike
    from .layout import CacheLayout

__all__ = [
    "backend_fingerprint",
    "backend_versions",
    "device_fingerprint",
    "as_recorded",
    "entry_key",
    "identity",
    "key_digest",
    "identity_of",
    "file_fp",
    "index_identity",
    "location",
    "source_identity",
    "spec_text",
]


def location(url: str) -> str:
    """The spelling of ``url`` manifests record and ``cache ls`` shows: a local file's
    real path (:attr:`~ptestore.storage.types.StorageURL.location`), else the URL as
    :func:`~ptestore.storage.types.redacted_url` shows it (its credentials replaced by
    ``REDACTED``)."""
    u = StorageURL.of(url)
    return u.location if u.local else redacted_url(u.text)


def identity(url: str) -> str:
    """What names the object at ``url`` in a key: a local file's real path, else the URL
    without its credentials (:func:`~ptestore.storage.types.url_identity`): the same
    for every presigned URL of one object, and for :func:`location`'s spelling of it."""
    u = StorageURL.of(url)
    return u.location if u.local else url_identity(u.text)


def index_identity(url: str) -> str:
    """What names the index at ``url`` (a local real path, or the URL read or as a
    manifest records it) in a key and a comparison: without its credentials
    (:func:`~ptestore.storage.types.url_identity`), so a rotated credential in the
    index URL is the same index, and the redacted ``manifest["index"]`` compares equal
    to the URL as given. A URL without credentials is itself: the key it had before."""
    return identity(url)


def file_fp(named: Any) -> Any:
    """An index entry's file record (``pte``, ``ptd``: URL, size, digests) as a
    fingerprint holds it: its URL's identity (no credentials: a manifest is 0644)."""
    if isinstance(named, dict) and isinstance(named.get("url"), str):
        return {**named, "url": url_identity(named["url"])}
    return named


def source_identity(url: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The identity of the object at ``url``: for a local file one ``stat``
    (:func:`identity_of`); for a remote object its size, ETag and version id (one
    metadata request, opened with the loader's ``options``: those that apply to ``url``,
    :func:`~ptestore.storage.routing.options_for_loader`), or its SHA-256 when the store
    reports neither."""
    u = StorageURL.of(url)
    if u.local:
        path = u.location
        try:
            st = os.stat(path)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"{url}: no such file") from exc
        except OSError as exc:
            raise StorageError(f"{url}: cannot stat: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ConfigurationError(f"{url}: not a regular file")
        return identity_of(path, st)
    from ..storage.loaders import open_loader

    loader = open_loader(u, **(options or {}))
    try:
        etag = getattr(loader, "etag", None)
        version = getattr(loader, "version_id", None)
        # the URL without its credentials: a rotated signature is the same object
        ident: dict[str, Any] = {"url": identity(url), "size": loader.size(), "etag": etag}
        ident["version_id"] = version
        if etag is None and version is None:
            from ..provenance.stamp import describe_source

            ident["sha256"] = describe_source(loader).sha256
        return ident
    finally:
        loader.close()


def identity_of(path: str, st: os.stat_result) -> dict[str, Any]:
    """A local file's identity from its ``stat`` (or the ``fstat`` of a descriptor held
    on it): device, inode, size, ``mtime_ns`` and ``ctime_ns``. ``ctime`` is what a
    same-size rewrite that keeps its timestamps (``cp --preserve=timestamps`` into the
    same inode, an archive's normalized ``mtime``) still changes: no call sets it back."""
    return {
        "path": path,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def as_recorded(now: Any, recorded: Any) -> Any:
    """The identity (or fingerprint, with its ``source`` and ``ptd``) ``now`` as an
    entry recorded before ``ctime_ns`` was part of it would have it: without
    ``ctime_ns`` where ``recorded`` has none, so such an entry is compared as before
    (size, inode, ``mtime_ns``) until it is made again."""
    if not isinstance(now, dict) or not isinstance(recorded, dict):
        return now
    if "ino" in now and "ctime_ns" in now and "ctime_ns" not in recorded:
        return {k: v for k, v in now.items() if k != "ctime_ns"}
    if "source" in now:
        out = dict(now)
        for role in ("source", "ptd"):
            out[role] = as_recorded(now.get(role), recorded.get(role))
        return out
    return now


#: A backend instance's settings (its ``repr``) longer than this are keyed by their
#: SHA-256.
_MAX_SETTINGS = 200


def spec_text(backend: BackendLike) -> str:
    """How a backend is named in the cache's keys and fingerprints: a SPEC as given, a
    class by its name (as :func:`ptestore.provenance.stamp.spec_text` records them); an
    instance by its class and, when its class says them (a ``__repr__`` of its own:
    ``CommandBackend``'s command and options, a dataclass's fields), its settings, so
    that two instances of one class set up differently (``CommandBackend("cat")`` and
    ``CommandBackend("gzip")``) make two entries: they made one, the second call served
    the first's file."""
    if isinstance(backend, str):
        return backend.strip()
    cls = backend if isinstance(backend, type) else type(backend)
    text = f"{cls.__module__}:{cls.__qualname__}"
    if backend is cls or cls.__repr__ is object.__repr__:  # no settings it can say
        return text
    what = "its repr (what the device cache keys its settings by)"
    settings = guarded(text, what, repr, backend)  # backend code: a sys.exit() too
    if len(settings) > _MAX_SETTINGS:
        digest = hashlib.sha256(settings.encode("utf-8", "backslashreplace")).hexdigest()
        settings = f"sha256:{digest}"
    return f"{text} {settings}"


def device_fingerprint(device: DeviceProfile | None) -> list[str] | None:
    """``[name, digest]`` of the device profile (None without one)."""
    return None if device is None else [device.name, device.digest()]


#: Versions of backends given as SPEC strings (and of the installed set), read once per
#: process: resolving a registered name scans every installed distribution's entry
#: points (tens of ms), and an implementation's module, once imported, stays what it is
#: for the life of the process.
_SPEC_VERSIONS: dict[str, str] = {}
_INSTALLED: list[list[str]] | None = None
#: Whether this process has consulted a cache's snapshot of the installed metadata
#: (only its first ``ensure`` needs one: later ones have the caches above).
_SNAPSHOT_USED = False


def backend_fingerprint(backends: list[BackendLike] | None, layout: CacheLayout) -> list[list[str]]:
    """``[spec, version]`` of every backend; the installed distributions' metadata
    (entry points, distribution versions) is read through the cache's snapshot
    (:mod:`ptestore.backends.snapshot`), so a fresh process whose installation is
    unchanged does not read it again."""
    global _SNAPSHOT_USED
    if _SNAPSHOT_USED:  # later calls: this process's own caches (below and in compat)
        return backend_versions(backends)
    _SNAPSHOT_USED = True
    from ..backends.snapshot import using

    with using(layout.snapshot):
        return backend_versions(backends)


def backend_versions(backends: list[BackendLike] | None) -> list[list[str]]:
    """``[spec, version]`` of every backend (None: the installed ones), read from the
    installation (:func:`backend_fingerprint` reads it through a cache's snapshot)."""
    global _INSTALLED
    from ..backends.registry import installed_backends, load_backend

    if backends is None:
        if _INSTALLED is None:
            out = []
            for inst in installed_backends():
                if inst.error is not None:
                    continue
                try:
                    version = version_of(load_backend(inst.name), inst.name)
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
                _SPEC_VERSIONS[spec] = version_of(load_backend(b), spec)
            version = _SPEC_VERSIONS[spec]
        else:
            version = version_of(load_backend(b), spec)
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
    """The cache key: the entry's directory name (32 hex digits), from the sources'
    :func:`identity` (a presigned URL's signature, credential, token and expiry, and a
    URL's user information, left out: a rotated signature finds the same entry). An
    entry made without provenance has a key of its own (its bytes differ: no
    trailer)."""

    material: list[Any] = [
        "ptestore.ensure/1",
        identity(source),
        None if ptd is None else identity(ptd),
        None if backends is None else [spec_text(b) for b in backends],
        None if device is None else device.name,
        bool(in_place),
    ]
    if not provenance:  # appended only when off: the keys of existing entries stay
        material.append("no-provenance")
    return key_digest(material)


def key_digest(material: list[Any]) -> str:
    """32 hex digits of the SHA-256 of ``material``'s canonical JSON as UTF-8, a name's
    bytes that are not UTF-8 (a path Python decoded with ``surrogateescape``: Linux
    allows any byte but NUL and ``/`` in a name) as those bytes, as ``os.fsencode``
    gives them: the key of every UTF-8 name is what it always was, and two names of
    different bytes have different keys. Another lone surrogate (one no file name
    decodes to: a URL given to the API) is encoded as ``surrogatepass`` does, which no
    UTF-8 text is."""
    text = canonical_json(material)
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:32]
