"""``ensure(index, model=..., device=...)``: the artifact a fleet's job index selects for
this device, downloaded once into the cache and kept while the index names it.

The entry's key is the index's location, the model and the device name. Its manifest
records the index entry it was fetched for (the selected files' URL, size, SHA-256 and
trailer checksum, and the device the artifact was made for): a call finds it current
when :func:`~ptestore.select` still picks exactly those files, without downloading
anything; when the index names another artifact (a newer run), the entry is stale and
fetched again, in its place. The download is :func:`~ptestore.fetch`'s: verified against
the index before it is published, resumable. A download that does not match the index
raises :class:`~ptestore.errors.IntegrityError` and leaves the entry as it was.

When no artifact of the index fits the device, :func:`~ptestore.select` answers with the
model's portable source: it is specialized here, as :func:`~ptestore.ensure` does for any
source (with the given backends; an entry of its own, keyed on the source).

The fleet modules (select, fetch) are imported here, on first use: a local ``ensure``
never loads them.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

from ..backends.compat import DeviceProfile, canonical_json
from ..errors import ConfigurationError, StorageError
from ..storage.types import StorageURL
from .cache import CacheLayout
from .manifest import Manifest, as_json, file_records

if TYPE_CHECKING:
    from ..fleet.select import Choice

__all__ = ["choose", "fetch_entry", "index_fingerprint", "index_key"]

#: The names the download is published under before it replaces the entry's files.
_INCOMING = "incoming.pte"


def _location(url: str) -> str:
    return StorageURL.of(url).location


def index_key(index: str, model: str, device: DeviceProfile) -> str:
    """The cache key of ``model`` for ``device`` from the index at ``index``."""
    material = ["ptestore.ensure-index/1", _location(index), model, device.name]
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()[:32]


def choose(index: str, model: str, device: DeviceProfile | None, opts: dict[str, Any]) -> Choice:
    """What :func:`~ptestore.select` picks for ``model`` on ``device`` in ``index``."""
    from ..fleet.select import select

    if not isinstance(model, str) or not model:
        raise ConfigurationError(f"{index}: model must be a model name of the index, got {model!r}")
    if device is None:
        raise ConfigurationError(f"{index}: ensure from an index needs device= (CLI: --device)")
    return select(index, model, device, storage_options=opts)


def index_fingerprint(
    index: str, model: str, device: DeviceProfile, choice: Choice
) -> dict[str, Any]:
    """What an entry fetched from an index is current for: the index entry's files (URL,
    size, SHA-256, trailer checksum), the device it was made for, this device's digest."""
    value = {
        "index": _location(index),
        "model": model,
        "device": [device.name, device.digest()],
        "made_for": choice.made_for,
        "pte": choice.pte,
        "ptd": choice.ptd,
    }
    out: dict[str, Any] = as_json(value)  # as the manifest stores it
    return out


def _discard(incoming: str) -> None:
    """Remove what a failed fetch published under the incoming names (not its partial
    downloads, from which the next attempt resumes)."""
    from ..fleet.job import ptd_beside

    for name in (incoming, ptd_beside(incoming)):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def fetch_entry(
    layout: CacheLayout,
    key: str,
    index: str,
    model: str,
    device: DeviceProfile,
    opts: dict[str, Any],
    names: tuple[str, str],
) -> Manifest:
    """Fetch what ``index`` selects into entry ``key`` (its lock held exclusively), under
    the ``names`` of its ``.pte`` and ``.ptd``; returns the manifest to publish."""
    from ..fleet.fetch import fetch
    from ..fleet.job import ptd_beside
    from ..provenance import read_provenance
    from ..storage.atomic import rename
    from ..storage.loaders import LocalFileLoader

    pte_name, ptd_name = names

    directory = layout.make_entry_dir(key)
    incoming = os.path.join(directory, _INCOMING)
    # Verified before anything is published under ``incoming``; a mismatch raises and the
    # entry's own files and manifest stay as they were. An interrupted download resumes.
    # (fetch checks every file before it publishes any; a failure while publishing the
    # .pte, after the .ptd, removes the .ptd.)
    try:
        result = fetch(index, incoming, model=model, device=device, storage_options=opts)
    except BaseException:
        _discard(incoming)
        raise
    choice = result.choice
    assert choice is not None  # fetched from an index
    if choice.kind != "artifact":  # the index changed since it was read: nothing fits now
        _discard(incoming)
        raise StorageError(
            f"{index}: the index changed while {model!r} was fetched for {device.name!r} "
            "(no artifact fits any more); run again"
        )
    published = {"pte": pte_name}
    if choice.ptd is not None:
        rename(ptd_beside(incoming), os.path.join(directory, ptd_name), durable=False)
        published["ptd"] = ptd_name
    rename(incoming, os.path.join(directory, pte_name))  # one directory fsync for both
    loader = LocalFileLoader(os.path.join(directory, pte_name))
    try:
        prov = read_provenance(loader)
    finally:
        loader.close()
    assert prov is not None  # fetch checked the trailer the index names
    return Manifest.of(
        key=key,
        source=choice.pte["url"],
        ptd_source=None if choice.ptd is None else choice.ptd["url"],
        index=_location(index),
        fingerprint=index_fingerprint(index, model, device, choice),
        files=file_records(directory, published),
        specialized=True,
        provenance=prov,
        choice=choice.to_dict(),
    )
