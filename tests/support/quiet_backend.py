"""A backend that does nothing: for the tests of what ptestore says when a backend
declines without a word (it visits every input and writes nothing)."""

from __future__ import annotations

from ptestore.backends import BackendDataInitContext, BackendDataWriter, BackendInterface

__all__ = ["Quiet"]


class Quiet(BackendInterface):
    """Visits every input and writes nothing."""

    name = "XnnpackBackend"

    def initialize_backend_data(
        self, context: BackendDataInitContext, output: BackendDataWriter
    ) -> None:
        for _ in context:
            pass
