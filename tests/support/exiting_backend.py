"""Backends whose methods call ``sys.exit()`` outside their run (a vendor SDK that exits
on an unknown SoC): ``check_compatibility`` (``verify``, ``select``, a fleet plan) and
``compatibility_info`` (the run's provenance stamp). Each is named as the backend's
failure (``tests/backends/test_backend_exits.py``), never a silent exit."""

from __future__ import annotations

import sys
from typing import Any

from ptestore.backends import BackendData, BackendInterface, Compatibility, DeviceProfile


class Exit(BackendInterface):
    """Writes a named key unchanged; ``check_compatibility`` exits with status 0."""

    name = "XnnpackBackend"
    version = "1"

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        key = sorted(named)[0]
        output.write_named_data(key, BackendData(bytes(named.get_data(key))))

    def check_compatibility(self, info: str, device: DeviceProfile | None) -> Compatibility:
        sys.exit(0)


class InfoExit(Exit):
    """``compatibility_info`` exits with status 3 (after a good run)."""

    def compatibility_info(self, context: Any) -> str:
        sys.exit(3)


class VersionExit(Exit):
    """Reading ``version`` exits (an SDK probe that gives up)."""

    @property
    def version(self) -> str:  # type: ignore[override]
        sys.exit("no SDK")
