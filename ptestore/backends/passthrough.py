"""``passthrough``: replaces nothing; the output is the compacted, re-laid-out container.

Useful to compact a file (drop trailing bytes, unreferenced padding), to move it between
storages atomically, and as the baseline of a pipeline.
"""

from __future__ import annotations

from .api import BackendDataInitContext, BackendDataWriter, BackendInterface

__all__ = ["PassthroughBackend"]


class PassthroughBackend(BackendInterface):
    """Visits every delegate input of its backend id and submits no replacement."""

    name = "*"

    def __init__(self, name: str | None = None) -> None:
        if name:
            self.name = name

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for _ in context:
            pass

    def __repr__(self) -> str:
        return f"PassthroughBackend(name={self.name!r})"
