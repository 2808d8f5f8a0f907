"""A backend for fleet and verify tests: device-dependent output, a settable version
and a compatibility string, importable by worker processes as
``support.fleet_backend:Scaler``.

SPEC ``support.fleet_backend:Scaler=VERSION`` (default 1.0). For every named float32
weight of the model it writes the weight times the device option ``scale`` (default
1.0); ``compatibility_info`` is ``"scaler;soc=<soc>;v=<version>"`` and
``check_compatibility`` rates it ``OPTIMAL`` for the same SoC and version,
``PREFER_RESPECIALIZATION`` for the same SoC at another version, else ``UNSUPPORTED``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ptestore.backends import BackendData, BackendInterface
from ptestore.backends.compat import Compatibility, DeviceProfile


class Scaler(BackendInterface):
    name = "XnnpackBackend"

    def __init__(self, version: str = "1.0") -> None:
        self.version = version

    def __repr__(self) -> str:
        return f"Scaler({self.version!r})"

    def initialize_backend_data(self, context, output):  # type: ignore[no-untyped-def]
        for _ in context:
            pass
        device = context.device
        scale = float(device.options.get("scale", 1.0)) if device is not None else 1.0
        named = context.get_named_data_map()
        for key in list(named):
            if key in context.replaced_keys:
                continue
            raw = bytes(named.get_data(key))
            if len(raw) % 4:
                continue
            values = np.frombuffer(raw, dtype=np.float32) * np.float32(scale)
            output.write_named_data(key, BackendData(values.astype(np.float32).tobytes()))

    def compatibility_info(self, context) -> str:  # type: ignore[no-untyped-def]
        soc = context.device.options.get("soc", "") if context.device is not None else ""
        return f"scaler;soc={soc};v={self.version}"

    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        soc = device.options.get("soc", "") if device is not None else ""
        parts = dict(p.split("=", 1) for p in info.split(";")[1:] if "=" in p)
        if parts.get("soc") != soc:
            return Compatibility.UNSUPPORTED
        if parts.get("v") != self.version:
            return Compatibility.PREFER_RESPECIALIZATION
        return Compatibility.OPTIMAL


def specialized_pair(tmp: Path, name: str, scale: float) -> tuple[Path, Path]:
    """The real ``mlp_xnnpack_ext`` .pte/.ptd pair specialized by :class:`Scaler` for a
    device ``name`` of ``scale``, side by side in ``tmp/name/``."""
    import ptestore
    from support.fixtures import get_fixture

    ext = get_fixture("mlp_xnnpack_ext")
    assert ext.pte_path is not None and ext.ptd_path is not None
    pte, ptd = tmp / name / "m.pte", tmp / name / "m.ptd"
    pte.parent.mkdir()
    ptestore.specialize(
        ext.pte_path,
        pte,
        ptd=(ext.ptd_path, ptd),
        backends=["support.fleet_backend:Scaler=1.0"],
        device=DeviceProfile(name, {"soc": "x", "scale": scale}),
    )
    return pte, ptd
