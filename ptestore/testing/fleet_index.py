"""Synthetic fleet index entries, shaped and sized as a real run writes them.

For tests and benchmarks of indexes at fleet scale (``benchmarks/bench_index.py``): an
entry has every field :func:`ptestore.fleet.index.entry_for` writes (URLs, sizes and
SHA-256 digests of the source, the ``.pte`` and a shared ``.ptd``, the device options and
digest, the provenance key, the job, one backend's compatibility stamp), about 1.5 KB
as version 2 stored it (indented JSON), 1.36 KB compact. The device's SoC, one of
``socs``, is taken from a hash of its name, and the stamp names it: ``socs`` kinds of
build per model.
A backend that rates those stamps is :class:`SocBackend`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..backends.api import BackendInterface
from ..backends.compat import Compatibility, DeviceProfile

__all__ = [
    "STAMP_ID",
    "SocBackend",
    "catalog_disagreements",
    "device_name",
    "soc_of",
    "synthetic_entry",
]

#: The backend id of the synthetic entries' stamps.
STAMP_ID = "SyntheticNpu"


def _hex(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()


def device_name(i: int) -> str:
    """The name of synthetic device ``i`` (``dev-000042``)."""
    return f"dev-{i:06d}"


def soc_of(device: str, socs: int) -> str:
    """The SoC of ``device`` among ``socs`` (from a hash of its name)."""
    return f"soc{int(_hex(device)[:8], 16) % max(1, socs)}"


def synthetic_entry(
    model: str,
    device: str,
    *,
    socs: int = 8,
    root: str = "s3://fleet/models",
    generation: int = 0,
) -> dict[str, Any]:
    """The index entry of ``model`` made for ``device`` (``generation`` changes its
    digests, as a newer run's artifact would)."""
    soc = soc_of(device, socs)
    options = {"soc": soc, "sdk": "2.31", "memory_mb": 8192}
    size = 1_000_000 + int(_hex(model)[:5], 16)
    ptd = _hex("ptd", model, soc)
    return {
        "model": model,
        "device": device,
        "device_options": options,
        "device_digest": "sha256:" + _hex("device", device, soc),
        "key": "sha256:" + _hex("key", model, device, generation),
        "job": {"path": "fleet/job.toml", "sha256": "sha256:" + _hex("job", generation)},
        "source": {
            "url": f"s3://fleet/src/{model}.pte",
            "size": size,
            "sha256": "sha256:" + _hex("src", model),
        },
        "ptd_source": {
            "url": f"s3://fleet/src/{model}.ptd",
            "size": size * 40,
            "sha256": "sha256:" + _hex("srcptd", model),
        },
        "pte": {
            "url": f"{root}/{device}/{model}.pte",
            "size": size + 4096,
            "sha256": "sha256:" + _hex("pte", model, device, generation),
            "trailer_sha256": "sha256:" + _hex("trailer", model, device, generation),
        },
        "ptd": {
            "url": f"{root}/_shared/sha256-tree/{ptd}.ptd",
            "size": size * 40,
            "sha256": "sha256:" + ptd,
            "trailer_sha256": None,
            "shared": True,
        },
        "compatibility": [
            {
                "id": STAMP_ID,
                "spec": "vendor_npu.backend:NpuBackend",
                "version": "2.3.0",
                "compatibility": f"sdk=2.31;soc={soc}",
            }
        ],
        "created": "2026-12-01T08:00:00Z",
    }


class SocBackend(BackendInterface):
    """Rates a synthetic stamp optimal on a device of the same ``soc`` option, else
    unsupported (installed on a selecting device with ``register_backend``)."""

    name = STAMP_ID
    version = "2.3.0"

    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        soc = None if device is None else device.options.get("soc")
        wanted = dict(p.split("=", 1) for p in info.split(";") if "=" in p).get("soc")
        return Compatibility.OPTIMAL if wanted == soc else Compatibility.UNSUPPORTED


def catalog_disagreements(url: str, options: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """What each model's catalog of the version 3 index at ``url`` says that its leaves
    do not (``{model: [problems]}``; empty when every catalog agrees):
    :func:`ptestore.fleet.index_check.check_index`'s ``problems`` (a rebuild's mark left
    behind is not one)."""
    from ..fleet.index_check import check_index

    found = check_index(url, options)
    if found.version != 3:
        raise ValueError(f"{url}: not a sharded (version 3) index")
    return found.problems
