"""A backend whose ``compatibility_info`` cannot be recorded: SPEC
``support.odd_info_backend:OddInfo=surrogate`` returns a lone surrogate,
``...=huge`` a string of 1 MiB + 1 bytes."""

from __future__ import annotations

from .fleet_backend import Scaler


class OddInfo(Scaler):
    def __init__(self, kind: str = "surrogate") -> None:
        super().__init__("1.0")
        self.kind = kind

    def compatibility_info(self, context) -> str:  # type: ignore[no-untyped-def]
        if self.kind == "huge":
            return "x" * ((1 << 20) + 1)
        return "soc=\udcff"
