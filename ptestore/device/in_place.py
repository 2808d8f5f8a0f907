"""``ensure(in_place=True)``: the source itself is rewritten once; the cache keeps only a
manifest with the identity the file has afterwards. The in-place machinery (the
coordinator) is imported when an entry is made, never for a hit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, PteStoreError, StorageError
from ..storage.types import StorageURL
from .artifact import Artifact, artifact_of, hit_or_make, lookup
from .cache import CacheLayout
from .keys import backend_fingerprint, device_fingerprint, entry_key, source_identity
from .manifest import Manifest, is_disk_full

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..backends.compat import DeviceProfile
    from ..backends.registry import BackendLike

__all__ = ["ensure_in_place"]


def ensure_in_place(
    layout: CacheLayout,
    src: str,
    ptd_src: str | None,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    max_bytes: int | None,
    provenance: bool = True,
) -> Artifact:
    """The entry of ``src`` rewritten in place: a hit while the file's identity is the
    one its manifest recorded, else the file is specialized in place again."""
    from ..journal import recover_if_local

    if ptd_src is not None:
        raise ConfigurationError(
            f"{src}: ensure(in_place=True) rewrites a .pte alone; a .pte/.ptd pair is "
            "cached as a copy (in_place=False)"
        )
    if not StorageURL.of(src).local:
        raise ConfigurationError(f"{src}: in-place specialization works on local files only")
    layout.create()
    key = entry_key(src, None, backends, device, True, provenance)
    recover_if_local(src)
    versions = backend_fingerprint(backends, layout)
    dev = device_fingerprint(device)

    def current() -> dict[str, Any]:
        return {"source": source_identity(src), "ptd": None, "backends": versions, "device": dev}

    return hit_or_make(
        layout,
        key,
        max_bytes,
        lambda: lookup(layout, key, current(), in_place=True),
        lambda: _make(layout, key, src, backends, device, current, provenance),
        before_make=lambda: recover_if_local(src),
    )


def _make(
    layout: CacheLayout,
    key: str,
    src: str,
    backends: list[BackendLike] | None,
    device: DeviceProfile | None,
    current: Callable[[], dict[str, Any]],
    provenance: bool = True,
) -> Artifact:

    from ..coordinator.inplace import specialize_in_place
    from ..provenance import read_provenance
    from ..provenance.stamp import ProvenanceRequest
    from ..storage.loaders import LocalFileLoader

    path = StorageURL.of(src).location
    try:
        report = specialize_in_place(
            path,
            backends=backends,
            device=device,
            provenance=ProvenanceRequest() if provenance else False,
            strict=False,  # an app's cache keeps what it was given when nothing applies
        )
    except (PteStoreError, OSError) as exc:
        if is_disk_full(exc):
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
    manifest = Manifest.of(
        key=key,
        source=path,
        fingerprint=current(),
        files={},
        specialized=report.specialized,
        provenance=prov,
        in_place=True,
    )
    layout.make_entry_dir(key)
    manifest.publish(layout, src)
    return artifact_of(layout, manifest, True)
