"""A backend whose ``version`` property raises (a version file it cannot read): every
place that reads a backend's version names it (``tests/backends/test_version_raises.py``)."""

from __future__ import annotations

from typing import Any

from ptestore.backends import BackendData, BackendInterface


class BrokenVersion(BackendInterface):
    """Doubles nothing: replaces the first named value by itself reversed."""

    name = "XnnpackBackend"

    @property
    def version(self) -> str:  # type: ignore[override]
        raise RuntimeError("cannot read VERSION")

    def initialize_backend_data(self, context: Any, output: Any) -> None:
        named = context.get_named_data_map()
        key = sorted(named)[0]
        output.write_named_data(key, BackendData(bytes(named.get_data(key))[::-1]))
